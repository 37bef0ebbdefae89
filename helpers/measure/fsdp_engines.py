"""The real FSDP2 and FSDP1 engines of scaled runs (one process per rank under torchrun, gloo on CPU) and of GPU mode
(one process per GPU, NCCL); `helpers.measure.scaled.engine_class` chooses among every real engine."""

from __future__ import annotations

import torch

from helpers.measure import engines
from helpers.measure.tracker import Tracker
from helpers.training import TrainSetup


class FSDP2Engine:
    """FSDP2 fully_shard over gloo on CPU, grouped as torchtitan does; offloaded shards placed on the host."""

    def __init__(self, net, s: TrainSetup, tracker: Tracker, device_type: str = "cpu"):
        from torch.distributed.device_mesh import init_device_mesh

        self.s, self.tracker, self.module, self.model = s, tracker, net, net
        pin = s.pin_memory and device_type == "cuda"             # a CPU-only machine cannot pin
        engines.shard_fsdp2(net, s, init_device_mesh(device_type, (s.gpus,)), pin_memory=pin)
        self.where = "host" if s.offload_params else "gpu"
        tracker.label(list(net.parameters()), "parameters", self.where)
        self.params = [p for p in net.parameters() if p.requires_grad]         # LoRA: the adapters only
        self.optimizer = engines.adamw(self.params, s.adam)
        self.describe = f"FSDP2 fully_shard over gloo, {s.gpus} processes under torchrun, torch AdamW ({s.adam})" + \
            (f", peft LoRA r={s.lora_rank} on {s.lora_targets} applied before fully_shard" if s.lora_rank else "")

    def forward(self, ids):
        with engines.fsdp_buffers_counted(self.tracker):
            return self.model(input_ids=ids, labels=ids).loss

    def backward(self, loss):
        with engines.fsdp_buffers_counted(self.tracker):
            engines.backward(self.tracker, loss, self.params, self.where)

    def step(self):
        engines.step(self.tracker, self.optimizer, self.where)    # with CPUOffloadPolicy the step runs on the host


class FSDP1Engine:
    """FSDP1 FullyShardedDataParallel over gloo on CPU, wrapped as `helpers.measure.fsdp1` says; with CPUOffload the
    flat shards, the host gradient buffers and the optimizer step are placed on the host."""

    def __init__(self, net, s: TrainSetup, tracker: Tracker, device_type: str = "cpu"):
        import contextlib

        from helpers.measure import fsdp1

        self.s, self.tracker, self.fsdp1 = s, tracker, fsdp1
        self.stack = contextlib.ExitStack()
        if device_type != "cuda":
            self.stack.enter_context(fsdp1.pinned_host_memory())        # a CPU-only machine cannot pin
            self.stack.enter_context(fsdp1.cpu_streams_synchronizable())
        self.stack.enter_context(fsdp1.reduce_scatter_counted(tracker))
        device = torch.device(device_type, torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")
        self.model = self.module = fsdp1.wrap(net, s, device_id=device)
        self.where = "host" if s.offload_params else "gpu"
        tracker.label(list(self.model.parameters()), "parameters", self.where)
        self.params = [p for p in self.model.parameters() if p.requires_grad]     # LoRA: the adapters' units only
        self.optimizer = engines.adamw(self.params, s.adam)
        self.device_type = device_type
        self.describe = (f"FSDP1 FullyShardedDataParallel (FULL_SHARD) over gloo, {s.gpus} processes under torchrun, "
                         f"torch AdamW ({s.adam})" + (", CPUOffload(offload_params=True)" if s.offload_params else "")
                         + (f", peft LoRA r={s.lora_rank} on {s.lora_targets}, wrapped by peft's fsdp_auto_wrap_policy"
                            if s.lora_rank else ""))

    def forward(self, ids):
        import contextlib

        autocast = torch.autocast(self.device_type, dtype=engines.HALF[self.s.half]) if self.s.mixed else \
            contextlib.nullcontext()            # accelerate runs an FSDP model's forward under autocast too
        with autocast:
            loss = self.model(input_ids=ids, labels=ids).loss
        self.fsdp1.label_buffers(self.tracker, self.model, self.s.offload_params)
        return loss

    def backward(self, loss):
        engines.backward(self.tracker, loss, self.params, self.where)

    def step(self):
        engines.step(self.tracker, self.optimizer, self.where)
