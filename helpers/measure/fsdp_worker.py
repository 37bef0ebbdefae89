"""One rank of a scaled FSDP2 or FSDP1 run (started by `scaled.run` under torchrun); rank 0 writes the Result."""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist

from helpers.measure import children, engines, scaled
from helpers.measure.tracker import Tracker
from helpers.training import TrainSetup
from helpers import models


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
        self.params = list(self.model.parameters())
        self.where = "host" if s.offload_params else "gpu"
        tracker.label(self.params, "parameters", self.where)
        self.optimizer = engines.adamw(self.params, s.adam)
        self.describe = (f"FSDP1 FullyShardedDataParallel (FULL_SHARD) over gloo, {s.gpus} processes under torchrun, "
                         f"torch AdamW ({s.adam})" + (", CPUOffload(offload_params=True)" if s.offload_params else ""))

    def forward(self, ids):
        loss = self.model(input_ids=ids, labels=ids).loss
        self.fsdp1.label_buffers(self.tracker, self.model, self.s.offload_params)
        return loss

    def backward(self, loss):
        engines.backward(self.tracker, loss, self.params, self.where)

    def step(self):
        engines.step(self.tracker, self.optimizer, self.where)


ENGINES = {"fsdp2": FSDP2Engine, "fsdp1": FSDP1Engine}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--twin", required=True)
    p.add_argument("--setup", required=True)
    p.add_argument("--steps", type=int, default=scaled.STEPS)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    children.watch_owner()                  # exit with the process that started torchrun, however it ends
    s = TrainSetup(**json.loads(a.setup))
    dist.init_process_group("gloo")
    started = time.perf_counter()
    torch.manual_seed(0)
    net = scaled.build_twin(a.twin, s)
    tracker = Tracker(default_device="gpu")
    with tracker:
        engine = ENGINES[s.strat.engine](net, s, tracker)
        tracker.label(list(net.buffers()), "parameters")
        tracker.restart_peak("setup")
        losses, rss, times = scaled.train(engine, tracker, s, models.spec(a.twin).vocab, a.steps)
    if dist.get_rank() == 0:
        r = scaled.result_from_census(a.twin, s, tracker, losses, rss, time.perf_counter() - started, engine.describe,
                           ranks=s.ranks_per_node, times=times)
        r.save(a.out)
    dist.barrier()                          # every rank done (and gloo's own threads idle) before the teardown
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
