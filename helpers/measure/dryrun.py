"""Dry runs: the real training step of the full-size model, executed on fake tensors, memory tracked.

The model is built from its config on the fake GPU (see fakegpu), a batch of random token ids goes through
forward, backward and the optimizer step (then a second forward and backward: the 'steady' phase), and the tracker
attributes every tensor's bytes. Nothing is allocated: Llama-3-8B runs in well under 1 GiB of RAM.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import platform
import time

import torch

from helpers import gpus, models
from helpers.errors import InputError
from helpers.measure import allocator, engines, fakegpu, provenance, reserved
from helpers.measure.tracker import Tracker
from helpers.results import DeviceMemory, Result
from helpers.training import TrainSetup, checked
from helpers.units import from_gib

MAX_FSDP2_RANKS = 128      # an fsdp2 dry run's time grows with the world size (see run)
ATTENTION = {"eager": "eager", "sdpa": "fake_gpu_attention", "flash": "fake_gpu_attention"}


def build_model(m: models.ModelSpec, setup: TrainSetup, device):
    """The model from its config on `device` (built on fake 'cpu', re-created there), in the dtype of its weights."""
    dtype = torch.bfloat16 if setup.precision == "bf16" or setup.strategy.startswith("zero") else torch.float32
    model = engines.build_model(m.path, setup, dtype, ATTENTION[setup.attention])
    if torch.device(device).type != "cpu":
        move_to(model, device)
    return model


def move_to(model, device) -> None:
    """Re-create parameters and buffers on `device` (fake tensors cannot be moved with Module.to)."""
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[name] = torch.nn.Parameter(torch.empty_like(p, device=device), p.requires_grad)
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = torch.empty_like(b, device=device)
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()


class SingleStep:
    """One GPU (or, per rank, the replicated strategies): torch AdamW, autocast for bf16-mixed."""

    def __init__(self, model, setup: TrainSetup, tracker: Tracker, mesh=None):
        self.model, self.setup, self.tracker = model, setup, tracker
        tracker.label(list(model.parameters()), "parameters")
        self.params = [p for p in model.parameters() if p.requires_grad]        # LoRA: the adapters only
        self.optimizer = engines.optimizer(self.params, setup, lr=1e-5)
        if setup.strategy == "ddp":          # DDP's reducer buckets: one flat gradient-sized buffer (measured as such)
            dev = self.params[0].device
            self.buckets = torch.empty(sum(p.numel() for p in self.params), dtype=self.params[0].dtype, device=dev)
            tracker.label([self.buckets], "comm_buffers")

    def forward(self, ids):
        ctx = fakegpu.autocast() if self.setup.precision == "bf16-mixed" else contextlib.nullcontext()
        with ctx:
            # the output (and its logits) is dropped, as trainers do
            loss = engines.causal_lm_loss(self.model, ids, self.setup.fused_ce, self.tracker)
            self.tracker.label(fakegpu.cached_weight_casts(), "temporaries")
        return loss

    def backward(self, loss):
        engines.backward(self.tracker, loss, self.params)

    def step(self):
        engines.step(self.tracker, self.optimizer)


class FSDP2Step(SingleStep):
    """FSDP2 on a fake process group (rank 0 of `gpus`): torchtitan's grouping, MixedPrecisionPolicy for
    bf16-mixed (bf16 compute, fp32 reduce), CPUOffloadPolicy (pageable: a fake host cannot pin) with offload."""

    def __init__(self, model, setup: TrainSetup, tracker: Tracker, mesh=None):
        engines.shard_fsdp2(model, setup, mesh, pin_memory=False)
        self.model, self.setup, self.tracker = model, setup, tracker
        self.params = list(model.parameters())
        tracker.label(self.params, "parameters")
        self.optimizer = engines.adamw(self.params, setup.adam, lr=1e-5)

    def forward(self, ids):
        with engines.fsdp_buffers_counted(self.tracker):
            return self.model(input_ids=ids, labels=ids).loss

    def backward(self, loss):
        with engines.fsdp_buffers_counted(self.tracker):
            super().backward(loss)


class ZeroEquivalentStep(SingleStep):
    """DeepSpeed ZeRO-1/2 re-enacted in torch (DeepSpeed itself cannot run on fake tensors), labelled as such.

    The same buffers as `deepspeed/runtime/zero/stage_1_and_2.py`, made at the same points: bf16 parameters; an fp32
    master partition (1/N, on the host with offload_optimizer); ipg reduce bucket(s) made when backward starts; each
    gradient copied into a contiguous bf16 partition (ZeRO-2) or kept whole (ZeRO-1) as it is made; at the step an
    fp32 copy of the gradient partition, then Adam (torch's fused AdamW standing in for FusedAdam/DeepSpeedCPUAdam).
    """

    def __init__(self, model, setup: TrainSetup, tracker: Tracker, mesh=None):
        self.model, self.setup, self.tracker = model, setup, tracker
        tracker.label(list(model.parameters()), "parameters")
        self.params = [p for p in model.parameters() if p.requires_grad]        # LoRA: the adapters only
        G, dev = setup.gpus, self.params[0].device
        self.part = -(-sum(p.numel() for p in self.params) // G)
        self.host = torch.device("cpu") if setup.offload_optimizer else dev
        self.master = torch.nn.Parameter(torch.empty(self.part, dtype=torch.float32, device=self.host))
        tracker.label([self.master], "master_weights")
        self.host_grad = None
        if setup.offload_optimizer:
            self.host_grad = torch.empty(self.part, dtype=torch.float32, device=self.host)
            tracker.label([self.host_grad], "gradients")
            largest = max(p.numel() for p in self.params)
            self.staging = [torch.empty(largest, dtype=torch.bfloat16, device=d) for d in (self.host, dev)]
            self.staging.append(torch.empty(self.part, dtype=torch.bfloat16, device=self.host))
            tracker.label(self.staging, "comm_buffers")
        self.optimizer = torch.optim.AdamW([self.master], lr=1e-5, fused=True)
        self.buckets, self.partition, self.offset = None, None, 0
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._reduce)

    def forward(self, ids):
        return engines.causal_lm_loss(self.model, ids, self.setup.fused_ce, self.tracker)

    def backward(self, loss):
        self.offset = 0
        super().backward(loss)
        self.buckets = None                    # DeepSpeed releases its ipg buckets when backward ends

    def _reduce(self, p):
        """What DeepSpeed's gradient hooks do: keep this rank's share of the gradient, free the rest."""
        if self.setup.strategy == "zero1" and not self.setup.offload_optimizer:
            self.tracker.label([p.grad], "gradients")
            return
        if self.buckets is None:               # made by the first gradient hook
            n = 2 if self.setup.overlap else 1
            self.buckets = [torch.empty(self.setup.reduce_bucket_size, dtype=torch.bfloat16, device=p.device)
                            for _ in range(n)]
            self.tracker.label(self.buckets, "comm_buffers")
        n = -(-p.numel() // self.setup.gpus)
        n = min(n, self.part - self.offset)
        if self.host_grad is not None:
            self.host_grad.narrow(0, self.offset, n).copy_(p.grad.view(-1)[:n])
        else:
            if self.partition is None:
                self.partition = torch.empty(self.part, dtype=p.dtype, device=p.device)
                self.tracker.label([self.partition], "gradients")
            self.partition.narrow(0, self.offset, n).copy_(p.grad.view(-1)[:n])
        self.offset += n
        p.grad = None

    def step(self):
        flat = None
        if self.host_grad is not None:
            self.master.grad = self.host_grad
        else:
            if self.partition is None:        # ZeRO-1: flatten this rank's share of the whole gradients
                share, left = [], self.part
                for p in self.params:
                    n = min(-(-p.numel() // self.setup.gpus), left)
                    share.append(p.grad.view(-1)[:n])
                    left -= n
                flat = torch.cat(share)
                del share
            else:                             # ZeRO-2: flatten the partition's views (a copy), as DeepSpeed does
                flat = torch.cat([self.partition])
            self.tracker.label([flat], "gradients")
            self.master.grad = flat.float()
            self.tracker.label([self.master.grad], "gradients")
            for p in self.params:
                p.grad = None
        self.optimizer.step()
        self.tracker.label(engines.optimizer_states(self.optimizer), "optimizer_states")
        if self.host_grad is None:
            self.master.grad = None
        self.partition = flat = None          # released when step() returns


def _fake_mesh(world: int):
    """A device mesh over a fake process group of `world` ranks, this process being rank 0."""
    from torch.distributed.device_mesh import init_device_mesh

    from helpers.measure import procgroup

    procgroup.ensure("fake", world)
    return init_device_mesh(fakegpu.NAME, (world,))


class NullTracker:
    """Stands in for the Tracker to time the same step untracked."""

    def label(self, tensors, category, device=None): pass
    def set_context(self, name): pass
    def restart_peak(self, phase): pass

    @contextlib.contextmanager
    def phase(self, name, activity=None):
        yield

    @contextlib.contextmanager
    def made_as(self, category):
        yield

    @contextlib.contextmanager
    def paused(self):
        yield

    def __enter__(self): return self
    def __exit__(self, *exc): return False


ENGINES = {
    "single": "torch AdamW on one GPU",
    "ddp": "torch AdamW, plus one gradient-sized DDP bucket buffer (DDP itself not run)",
    "zero1": "DeepSpeed ZeRO-1 re-enacted in torch (DeepSpeed cannot run on fake tensors)",
    "zero2": "DeepSpeed ZeRO-2 re-enacted in torch (DeepSpeed cannot run on fake tensors)",
    "fsdp2": "FSDP2 fully_shard on a fake process group, rank 0's view",
}


def run(model, setup: TrainSetup, progress: bool = True, track: bool = True, gpu: str | None = None,
        alloc_conf: str | None = None) -> Result:
    """Dry-run one set-up: a Result with mode 'dry-run' (GPU per rank, host per node), with the reserved view: the
    caching allocator modelled on the step's allocations (`alloc_conf` as PYTORCH_CUDA_ALLOC_CONF, e.g.
    'expandable_segments:True'), plus the CUDA context of `gpu` (a helpers.gpus preset) and NCCL's buffers."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from tqdm.auto import tqdm

    setup = checked(setup)
    allocator.Config.parse(alloc_conf)                      # bad settings and GPU names refused before the run
    if gpu is not None:
        gpus.preset(gpu)
    engines.refuse_unsupported(setup, "dry")
    if setup.optimizer == "adamw-8bit":
        raise InputError("optimizer 'adamw-8bit' has no dry run: bitsandbytes' kernels cannot run on fake tensors; "
                         "its states are in `estimate` and measured for real in a scaled run")
    m = models.spec(model)
    m.check_lora_rank(setup.lora_rank)
    if setup.strategy not in STEPS:
        raise InputError(
            f"no dry run for strategy {setup.strategy!r}: DeepSpeed cannot run on fake tensors, and ZeRO-3's "
            f"gathering has no faithful torch re-enactment here; dry runs exist for {', '.join(STEPS)} "
            f"(fsdp2 shards as ZeRO-3 does; a scaled real run uses DeepSpeed itself)")
    if setup.strategy == "fsdp2" and setup.gpus > MAX_FSDP2_RANKS:
        raise InputError(
            f"gpus must be at most {MAX_FSDP2_RANKS} in an fsdp2 dry run, got {setup.gpus}: rank 0's all-gathers "
            f"touch every rank's shard, so the fake step's time grows with the world size (~40 s at 256, minutes "
            f"beyond); `estimate` takes any world size")
    started = time.perf_counter()
    dev = fakegpu.device()
    bar = tqdm(total=6, desc=f"dry run {m.name}", disable=not progress, leave=False)
    mesh = _fake_mesh(setup.gpus) if setup.strategy == "fsdp2" else None
    with FakeTensorMode(allow_non_fake_inputs=True):
        net = build_model(m, setup, dev)                     # built before tracking: setup is the engine's state
        bar.update()
        tracker = Tracker() if track else NullTracker()
        stepped = time.perf_counter()
        with tracker, engines.untracked_sharding_propagation(tracker):
            engine = STEPS[setup.strategy](net, setup, tracker, mesh)
            tracker.label([b for b in net.buffers()], "parameters")
            tracker.restart_peak("setup")
            engines.watch_logits(net, tracker)
            ids = torch.randint(0, m.vocab, (setup.batch, setup.seq), device=dev)
            bar.update()
            for first in (True, False):
                with tracker.phase("forward" if first else "steady", activity="forward"):
                    loss = engine.forward(ids)
                bar.update()
                with tracker.phase("backward" if first else "steady", activity="backward"):
                    engine.backward(loss)
                    del loss
                bar.update()
                if first:
                    with tracker.phase("step"):
                        engine.step()
    step_s = time.perf_counter() - stepped
    bar.close()
    if not track:
        return Result(m.name, m.params, "dry-run (untracked)", dataclasses.asdict(setup), DeviceMemory({}),
                      DeviceMemory({}), meta={"step_s": round(step_s, 2)})
    scale = setup.ranks_per_node
    gpu_cap = None if setup.gpu_gib is None else from_gib(setup.gpu_gib)
    host_cap = None if setup.host_gib is None else from_gib(setup.host_gib)
    result = Result(
        model=m.name, params=m.params, mode="dry-run", setup=dataclasses.asdict(setup),
        gpu=DeviceMemory(tracker.breakdown("gpu"), gpu_cap), host=DeviceMemory(tracker.breakdown("host", scale), host_cap),
        meta={"date": datetime.datetime.now().isoformat(timespec="seconds"), "versions": provenance.versions(),
              "device": "fake tensors (no memory allocated); GPU = fake PrivateUse1 device 'gpu'",
              "engine": ENGINES[setup.strategy], "wall_s": round(time.perf_counter() - started, 2),
              "step_s": round(step_s, 2), "machine": platform.machine(),
              "note": ("host bytes are pageable: fake tensors cannot be pinned"
                       if setup.offload_optimizer or setup.offload_params else "")},
    )
    return reserved.attach(result, reserved.events_from(tracker), gpu, alloc_conf)


STEPS = {"single": SingleStep, "ddp": SingleStep, "zero1": ZeroEquivalentStep, "zero2": ZeroEquivalentStep,
         "fsdp2": FSDP2Step}
