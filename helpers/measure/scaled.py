"""Scaled runs: the model's tiny twin (`models.scaled_config`) trained for real on this machine's CPU, through the
set-up's own engine: torch (single, or DDP over gloo), DeepSpeed ZeRO-1/2/3 in this process (gloo, no launcher),
or FSDP2 or FSDP1 in one process per rank under torchrun (gloo).

Memory is the tracker's census of the engine's real tensors. A CPU has one RAM, so each tensor is placed by its role:
where the engine would keep it on a GPU machine (offloaded master weights, gradients and optimizer states on the
host, everything else on the GPU). The process's resident memory (RSS) is reported beside the census: it also holds
the Python interpreter, the libraries and the allocator's caches, which the census does not count.
DeepSpeed's buffer sizes (reduce_bucket_size, sub_group_size, prefetch) are scaled by the twin's share of the full
model's parameters, so that the twin keeps the full model's number of optimizer sub-groups.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import importlib
import json
import os
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import psutil
import torch

from helpers import deepspeed_ops, deepspeed_rules, estimate, models, provenance
from helpers import versions as library_versions
from helpers.errors import InputError, MeasurementError
from helpers.estimate import adapters, reference
from helpers.measure import children, engines, nf4, preference_loss, procgroup, rl_loss
from helpers.measure.fsdp_engines import FSDP1Engine, FSDP2Engine
from helpers.measure.steps import Hooks, run_steps
from helpers.measure.tracker import Tracker
from helpers.results import DeviceMemory, Result
from helpers.training import PREFERENCE_RUNS, TrainSetup, checked
from helpers.units import GiB, to_gib

MAX_FRACTION = 0.8          # a scaled run may use at most this share of the RAM available when it starts
MAX_PROCESSES = 4           # FSDP2 starts one process per rank
PROCESS_OVERHEAD = int(0.7 * GiB)   # interpreter, torch and transformers in each process (measured RSS, rounded up)
STEPS = 3
TORCHRUN_TIMEOUT_S = 600   # an FSDP2 twin run takes well under a minute
MAX_STEPS = 1000            # a memory measurement needs a few steps; more only takes longer


REFERENCE_RUNS = PREFERENCE_RUNS + ("grpo",)   # the runs whose engine takes a `reference` (None where none is loaded)


def check_steps(steps) -> None:
    """InputError unless `steps` is an integer in [1, MAX_STEPS] (forward, backward and step each need one)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise InputError(f"steps must be an integer in [1, {MAX_STEPS}], got {steps!r}")


def scaled_setup(model, setup: TrainSetup, hidden: int = models.SCALE_HIDDEN) -> tuple[Path, TrainSetup]:
    """The twin's config file, and the set-up with DeepSpeed's element counts scaled to the twin (and pin_memory
    off: a CPU-only machine cannot page-lock memory; DeepSpeed's CPU accelerator ignores the request)."""
    twin = models.scaled_path(model, hidden)
    share = models.spec(str(twin)).params / models.spec(model).params
    scale = lambda n: max(1000, int(n * share) // 2 * 2)   # even: DeepSpeed's ZeRO-1/2 asserts allgather_bucket_size
    #                                                           is a multiple of its nccl_start_alignment_factor, 2
    return twin, setup.replace(reduce_bucket_size=scale(setup.reduce_bucket_size),
                               sub_group_size=scale(setup.sub_group_size),
                               prefetch_bucket_size=scale(setup.prefetch_bucket_size), gpu_gib=None, host_gib=None,
                               pin_memory=False)


def guard(twin: Path, setup: TrainSetup) -> None:
    """Refuse, before it starts, a scaled run whose estimate would not fit in this machine's available RAM."""
    e = estimate.run(str(twin), setup, lifecycle=False)
    processes = setup.gpus if setup.strat.one_process_per_gpu else 1
    need = e.gpu.peak_bytes * processes + e.host.peak_bytes + PROCESS_OVERHEAD * processes
    available = psutil.virtual_memory().available
    if need > MAX_FRACTION * available:
        raise InputError(
            f"refused: this scaled run needs about {to_gib(need):.1f} GiB by its estimate ({to_gib(e.gpu.peak_bytes):.1f} "
            f"GiB per GPU x {processes} process(es) + {to_gib(e.host.peak_bytes):.1f} GiB host + "
            f"{to_gib(PROCESS_OVERHEAD * processes):.1f} GiB for the processes), and this machine has "
            f"{to_gib(available):.1f} GiB available (at most {MAX_FRACTION:.0%} may be used): lower batch or seq")


def run(model, setup: TrainSetup, steps: int = STEPS, progress: bool = True) -> Result:
    """Train the twin of `model` for `steps` real steps under `setup`'s engine; a Result with mode 'scaled'."""
    setup = checked(setup)
    check_steps(steps)
    engines.refuse_unsupported(setup, "scaled")
    models.spec(model).check_lora_rank(setup.lora_rank, setup.lora_targets)
    adapters.check_fsdp1(models.spec(model), setup)
    twin, s = scaled_setup(model, setup)
    st = s.strat
    if st.one_process_per_gpu and s.gpus > MAX_PROCESSES:
        raise InputError(f"a scaled {st.title} run starts one process per GPU; at most {MAX_PROCESSES} here, "
                         f"got gpus={s.gpus}")
    if st.deepspeed and s.gpus > 1:
        has_dry = "parameters" not in st.shards          # (ZeRO-1/2 have a dry run; ZeRO-3's is refused)
        raise InputError(f"a scaled DeepSpeed run is one process (one rank), got gpus={s.gpus}: use gpus=1 here; "
                         f"the partitioning over several GPUs is in `estimate`"
                         + (" and in `measure --mode dry-run`" if has_dry else ""))
    guard(twin, s)
    if st.one_process_per_gpu:
        return _pin_note(_run_torchrun(twin, s, steps), setup)
    started = time.perf_counter()
    torch.manual_seed(0)
    net = build_twin(twin, s)
    ref = build_reference(twin, s)
    tracker = Tracker(default_device="gpu")
    with engines.torch_globals_restored(), tracker:
        engine = engine_class(s)(net, s, tracker, **({"reference": ref} if s.run in REFERENCE_RUNS else {}))
        tracker.label(list(net.buffers()) + [p for p in net.parameters() if not p.requires_grad]
                      + nf4.state_tensors(net), "parameters")
        tracker.restart_peak("setup")
        losses, rss, times = train(engine, tracker, s, models.spec(str(twin)).vocab, steps, progress)
    r = result_from_census(twin, s, tracker, losses, rss, time.perf_counter() - started, engine.describe, ranks=1, times=times)
    r.meta.update(getattr(engine, "engine_meta", dict)())
    return _pin_note(r, setup)


def _pin_note(r: Result, asked: TrainSetup) -> Result:
    """Say so when the set-up asked for pinned offload buffers, which a CPU-only machine cannot give."""
    if asked.pin_memory and (asked.offload_optimizer or asked.offload_params):
        r.meta["note"] = "pin_memory cannot take effect on a CPU-only machine: host buffers are pageable"
    return r


def build_twin(twin: Path, s: TrainSetup):
    """The twin's model, in the set-up's weight dtype and attention kernel (random weights)."""
    dtype = torch.bfloat16 if s.precision == "bf16" else torch.float32
    return engines.build_model(str(twin), s, dtype, "eager" if s.attention == "eager" else "sdpa")


def build_reference(twin: Path, s: TrainSetup):
    """DPO's (KTO's) frozen reference copy of the twin (reference 'copy'), loaded as TRL 1.10 loads it
    (`create_model_from_path` with the policy's model_init_kwargs: the same dtype; no adapters, no checkpointing, which
    TRL turns off for the reference forward), frozen, in eval mode; None for every other set-up."""
    if not reference.holds_copy(s):
        return None
    if s.quantized:
        raise InputError(f"a scaled {s.run.upper()} run with a reference copy loads it as the policy's base, not 4-bit: got "
                         f"base_weights {s.base_weights!r}; use reference 'adapters-off' (TRL's LoRA way), or "
                         f"`estimate`")
    torch.manual_seed(0)                    # the policy's own initial weights: DPO's loss starts at log 2
    ref = build_twin(twin, s.replace(lora_rank=None, checkpointing="none"))
    return ref.requires_grad_(False).eval()


def train(engine, tracker: Tracker, s: TrainSetup, vocab: int, steps: int,
          progress: bool = False) -> tuple[list[float], dict, dict]:
    """Forward, backward and step `steps` times on one fixed batch (so the loss must fall); RSS at each phase's end;
    the wall time of each forward, backward and optimizer step (seconds, tracker included); a progress bar
    (notebook-aware, gone when done) with `progress`."""
    from tqdm.auto import tqdm

    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (reference.pairs(s).batch, s.seq), generator=gen)   # (a reward model's pairs)
    engines.watch_logits(engine.module, tracker)
    with tqdm(total=steps, desc=f"twin, {s.strategy}: training steps", leave=False, disable=not progress) as bar:
        hooks = _Recorder(bar)
        with nf4.matmul_as(s), engines.kv_expanded(s):
            run_steps(engine, tracker, ids, s.grad_accum, steps, hooks=hooks)
    return hooks.losses, hooks.rss, hooks.times


class _Recorder(Hooks):
    """The scaled run's record of the shared loop: each iteration's first loss, the process's RSS at each phase's end
    (the largest), and the wall time of every forward, backward and optimizer step."""

    def __init__(self, bar):
        self.bar, self.losses, self.rss = bar, [], {}
        self.times = {"forward": [], "backward": [], "step": []}
        self.proc = psutil.Process()

    def after(self, phase, activity, seconds):
        self.times[activity].append(seconds)
        self.rss[phase] = max(self.rss.get(phase, 0), self.proc.memory_info().rss)
        if activity == "step":
            self.bar.update()

    def loss(self, iteration, loss):
        self.losses.append(float(loss.detach()))


class TorchEngine:
    """torch AdamW on the twin; DDP (over a one-rank gloo group) for strategy 'ddp'; CPU autocast for bf16-mixed."""

    def __init__(self, net, s: TrainSetup, tracker: Tracker, device_type: str = "cpu", reference=None):
        """`device_type` is read from the parameters (the argument is there for one signature across engines);
        `reference`: DPO's frozen copy (`build_reference`), kept whole as accelerate's prepare_model(evaluation_mode)
        keeps it."""
        self.s, self.tracker, self.module, self.reference = s, tracker, net, reference
        self.actor = rl_loss.ActorStep(s, tracker.set_context)        # (OpenRLHF's actor: dpo_logps 'openrlhf')
        self.params = list(net.parameters())
        tracker.label(self.params, "parameters")
        if reference is not None:
            tracker.label(list(reference.parameters()) + list(reference.buffers()), "parameters")
            engines.watch_logits(reference, tracker)
        self.model = net
        self.device_type = self.params[0].device.type
        if s.strat.gradient_buckets:            # DDP
            procgroup.ensure("nccl" if self.device_type == "cuda" else "gloo", s.gpus if self.device_type == "cuda" else 1)
            with tracker.made_as("comm_buffers"):
                self.model = torch.nn.parallel.DistributedDataParallel(net)
        self.optimizer = engines.optimizer(self.params, s)
        self.scaler = engines.grad_scaler(s, self.device_type)
        self.describe = engines.optimizer_name(s) + (", DistributedDataParallel over gloo, one rank (a replica's "
                                                     "memory does not depend on the world size)" if s.strat.gradient_buckets else "")

    def _amp(self):
        """CPU autocast in the set-up's 16-bit dtype for mixed precision; nothing otherwise."""
        return (torch.autocast(self.device_type, dtype=engines.HALF[self.s.half]) if self.s.mixed
                else contextlib.nullcontext())

    def forward(self, ids):
        if self.s.dpo_logps == "openrlhf":
            return self.actor(lambda x: self._autocast_forward(self.model, x).logits, ids)
        if self.s.run in PREFERENCE_RUNS:
            return preference_loss.loss(lambda x: self._autocast_forward(self.model, x),
                                        None if self.s.ref == "none" else self._reference_forward, ids, self.s,
                                        self.tracker.set_context)
        with self._amp():
            if self.s.run == "rm":
                return engines.reward_loss(self.model, ids, self.s)
            if self.s.fused_ce:
                return engines.causal_lm_loss(self.module, ids, True, self.tracker)
            return self.model(input_ids=ids, labels=ids).loss

    def _autocast_forward(self, model, ids):
        with self._amp():
            return model(input_ids=ids)

    def _reference_forward(self, ids):
        """DPO's reference forward (called under no_grad): the copy, or the unwrapped LoRA policy with its adapters
        disabled (peft's disable_adapter, as TRL's `use_adapter(model, None)`)."""
        if self.reference is not None:
            return self._autocast_forward(self.reference, ids)
        with self.module.disable_adapter():
            return self._autocast_forward(self.module, ids)

    def backward(self, loss):
        engines.backward(self.tracker, loss, self.params, scaler=self.scaler)

    def step(self):
        engines.step(self.tracker, self.optimizer, scaler=self.scaler)


class DeepSpeedEngine:
    """DeepSpeed itself, in this process over a one-rank gloo group, with the set-up's ZeRO configuration.

    Its buffers are named from the optimizer's own attributes (stage_1_and_2.py / stage3.py) and placed by role;
    ZeRO-3's optimizer sub-groups are placed as its ratio rule says (i < int((1 - ratio) * n) on the GPU): on a CPU,
    DeepSpeed's accelerator is the CPU itself, so its own `subgroup_to_device` says 'cpu' for all.
    """

    def __init__(self, net, s: TrainSetup, tracker: Tracker, device_type: str = "cpu", reference=None):
        """`reference`: DPO's frozen copy, prepared as TRL 1.10's `prepare_deepspeed` prepares it
        (`reference_config`: a second engine, stage 0 unless the policy's is 3, no optimizer)."""
        on_gpu = next(net.parameters()).is_cuda
        procgroup.ensure("nccl" if on_gpu else "gloo", s.gpus if on_gpu else 1)
        import deepspeed

        # DeepSpeed 0.19.8 calls torch.distributed collectives that torch 2.13 deprecates, warning on every call
        warnings.filterwarnings("ignore", category=FutureWarning,
                                message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated")
        self.s, self.tracker, self.module = s, tracker, net
        self.actor = rl_loss.ActorStep(s, tracker.set_context)        # (OpenRLHF's actor: dpo_logps 'openrlhf')
        engine, optimizer, config = initialize_deepspeed(net, s)
        self.engine, self.opt = engine, optimizer
        self.host = "host" if s.offload_optimizer else "gpu"
        self.describe = (f"DeepSpeed {deepspeed.__version__} ZeRO-{zero_stage(s)} in one process (gloo), "
                         + (f"the HF Trainer's way: {engines.optimizer_name(s)} handed to deepspeed.initialize as a "
                            f"client optimizer" if s.client_optimizer else adam_name(config)))
        self._label_buffers()
        self.reference = self._prepare_reference(reference)
        if hasattr(optimizer, "setup_buckets"):             # the ipg buckets, made by the first gradient hook
            setup_buckets = optimizer.setup_buckets

            def counted_setup_buckets(*args, **kwargs):
                with tracker.made_as("comm_buffers"):
                    return setup_buckets(*args, **kwargs)

            optimizer.setup_buckets = counted_setup_buckets
        inner = getattr(optimizer, "optimizer", None)
        if inner is not None:
            inner.register_step_pre_hook(lambda opt, args, kwargs: self._label_step_grads(opt))
        if inner is not None and s.client_optimizer:      # its own step's scratch tensors are temporaries
            inner_step = inner.step

            def counted_step(*args, **kwargs):
                with tracker.made_as("temporaries"):
                    return inner_step(*args, **kwargs)

            inner.step = counted_step

    def _prepare_reference(self, reference):
        """DPO's reference engine (None without a copy): its parameters labelled where the engine left them."""
        if reference is None:
            return None
        import deepspeed

        engine, *_ = deepspeed.initialize(model=reference, config=reference_config(self.s))
        engine.eval()
        zero3 = reference_config(self.s)["zero_optimization"]["stage"] == 3
        self.tracker.label([p.ds_tensor if zero3 else p for p in engine.module.parameters()]
                           + list(engine.module.buffers()), "parameters",
                           "host" if zero3 and self.s.offload_params else "gpu")
        engines.watch_logits(engine.module, self.tracker)
        return engine

    def _reference_forward(self, ids):
        """DPO's reference forward (called under no_grad): the copy's engine, or the LoRA policy with its adapters
        disabled."""
        if self.reference is not None:
            return self.reference(input_ids=ids)
        with self.module.disable_adapter():
            return self.engine(input_ids=ids)

    def forward(self, ids):
        if self.s.dpo_logps == "openrlhf":
            return self.actor(lambda x: self.engine(input_ids=x).logits, ids)
        if self.s.run == "rm":
            return engines.reward_loss(self.engine, ids, self.s)
        if self.s.run in PREFERENCE_RUNS:
            return preference_loss.loss(lambda x: self.engine(input_ids=x),
                                        None if self.s.ref == "none" else self._reference_forward, ids, self.s,
                                        self.tracker.set_context, fp32_outputs=preference_loss.fp32_outputs(self.s))
        return self.engine(input_ids=ids, labels=ids).loss

    def backward(self, loss):
        self.tracker.set_context("logits")
        self.engine.backward(loss)
        self.tracker.set_context(None)
        self._label_buffers()

    def micro_step(self):
        """DeepSpeed's step() inside an accumulation window: it counts the micro step and updates nothing."""
        self.engine.step()
        self._label_buffers()

    def step(self):
        # DeepSpeed's step() flattens gradients (a gradient, though a local) and runs Adam (on the host with offload)
        with self.tracker.placing(self.host), self.tracker.made_as("gradients"):
            self.engine.step()
        self._label_buffers()

    def engine_meta(self) -> dict:
        """What DeepSpeed itself decided and exposes: ZeRO-3's sub-group device map and its ratio (on a CPU the map says
        'cpu' for every group, since the accelerator is the CPU; the GPU/host roles are then placed by `_placement`)."""
        devices = getattr(self.opt, "subgroup_to_device", None)
        if devices is None:
            return {}
        return {"deepspeed_subgroup_to_device": [devices[i] for i in sorted(devices)],
                "deepspeed_partial_offload": float(getattr(self.opt, "partial_offload", 1.0))}

    def _placement(self) -> dict[int, str]:
        """Device of each ZeRO-3 optimizer sub-group by DeepSpeed's ratio rule."""
        groups = getattr(self.opt, "fp32_partitioned_groups_flat", [])
        n = len(groups)
        first_host = deepspeed_rules.first_host_group(n, self.s.ratio) if self.s.offload_optimizer else n
        return {id(g): ("gpu" if i < first_host else "host") for i, g in enumerate(groups)}

    def _label_buffers(self):
        o, t, host = self.opt, self.tracker, self.host
        if "parameters" in self.s.strat.shards:          # ZeRO-3
            place = self._placement()
            t.label([p.ds_tensor for p in self.module.parameters() if hasattr(p, "ds_tensor")], "parameters",
                    "host" if self.s.offload_params else "gpu")
            for g in o.fp32_partitioned_groups_flat:
                dev = place[id(g)]
                t.label([g], "master_weights", dev)
                t.label([g.grad] if g.grad is not None else [], "gradients", dev)
                t.label([v for v in o.optimizer.state.get(g, {}).values()
                         if isinstance(v, torch.Tensor) and v.numel() > 1], "optimizer_states", dev)
            buf = getattr(o, "grad_partitions_flat_buffer", None)
            t.label([buf] if buf is not None else [], "gradients", host)
        else:
            t.label(list(getattr(o, "bit16_groups_flat", [])), "parameters", "gpu")
            for g in o.single_partition_of_fp32_groups:
                t.label([g], "master_weights", host)
                t.label([g.grad] if g.grad is not None else [], "gradients", host)
                t.label([v for v in o.optimizer.state.get(g, {}).values()
                         if isinstance(v, torch.Tensor) and v.numel() > 1], "optimizer_states", host)
            t.label(list(getattr(o, "accumulated_grads_in_cpu", {}).values()), "gradients", host)
            gip = getattr(o, "grads_in_partition", None)
            t.label([gip] if gip is not None else [], "gradients", "gpu")
            for group in (getattr(o, "averaged_gradients", None) or {}).values():
                flat = getattr(group, "flat_partition", None)          # the pre-flattened bf16 partition
                t.label([flat] if isinstance(flat, torch.Tensor) else [], "gradients", "gpu")
            for name in ("temp_grad_buffer_for_cpu_offload", "temp_grad_buffer_for_gpu_offload"):
                buf = getattr(o, name, None)
                t.label([buf] if isinstance(buf, torch.Tensor) else [], "comm_buffers",
                        "host" if "cpu" in name else "gpu")
            t.label(list(getattr(o, "param_buffer_of_bit16_for_cpu_offload_groups", [])), "comm_buffers", "host")
        for bucket in getattr(o, "ipg_buckets", {}).values():
            t.label([b for b in getattr(bucket, "buffer", []) if isinstance(b, torch.Tensor)], "comm_buffers", "gpu")

    def _label_step_grads(self, inner):
        """Just before Adam runs: the fp32 gradients DeepSpeed made for it, on the device of their sub-group."""
        place = self._placement() if "parameters" in self.s.strat.shards else {}
        for group in inner.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self.tracker.label([p.grad], "gradients", place.get(id(p), self.host))


def zero_stage(s: TrainSetup) -> int:
    """DeepSpeed's ZeRO stage of a set-up: how many of optimizer states, gradients and parameters it shards."""
    return len(s.strat.shards)


def deepspeed_config(s: TrainSetup) -> dict:
    """The DeepSpeed configuration of a set-up (scaled sizes already applied)."""
    zero = {"stage": zero_stage(s), "reduce_bucket_size": s.reduce_bucket_size,
            "allgather_bucket_size": s.reduce_bucket_size, "overlap_comm": s.overlap, "contiguous_gradients": True}
    if zero_stage(s) == 3:
        zero.update(sub_group_size=s.sub_group_size, stage3_prefetch_bucket_size=s.prefetch_bucket_size,
                    stage3_param_persistence_threshold=0, stage3_max_live_parameters=s.prefetch_bucket_size * 4)
    if s.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": s.pin_memory,
                                     **({"ratio": s.offload_ratio} if s.offload_ratio is not None else {})}
    if s.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": s.pin_memory}
    config = {"train_micro_batch_size_per_gpu": s.batch, "gradient_accumulation_steps": s.grad_accum,
              "bf16": {"enabled": s.precision == "bf16-mixed"}, "zero_optimization": zero,
              "steps_per_print": 10**9, "wall_clock_breakdown": False}
    if s.client_optimizer:              # as transformers' deepspeed_optim_sched hands over the Trainer's optimizer
        return config | {"zero_allow_untested_optimizer": True}
    adam = {"lr": 1e-3}
    if deepspeed_ops.torch_path(s.offload_optimizer, s.offload_ratio if s.offload_optimizer else None):
        adam.update(torch_adam=True, fused=True)     # torch's fused AdamW: in place, like DeepSpeed's own kernels
    return config | {"optimizer": {"type": "AdamW", "params": adam}}


def reference_config(s: TrainSetup) -> dict:
    """The policy's DeepSpeed config as TRL 1.10's prepare_deepspeed (trl/models/utils.py) turns it into the
    reference's: a copy, the stage 0 unless it is 3, and (the engine built without an optimizer) no optimizer block."""
    config = deepspeed_config(s)
    config.pop("optimizer", None)
    config.pop("zero_allow_untested_optimizer", None)
    if config["zero_optimization"]["stage"] != 3:
        config["zero_optimization"]["stage"] = 0
    return config


def initialize_deepspeed(net, s: TrainSetup):
    """`deepspeed.initialize` on `net` with the set-up's configuration, in this process: (engine, optimizer, config).
    DeepSpeed's C++ Adam is built first where the configuration asks for it (a build says so before it starts)."""
    import deepspeed

    comm = importlib.import_module("deepspeed.comm.torch")
    comm.build_shm_op = lambda: None          # the shared-memory op only speeds up multi-process CPU runs
    config = deepspeed_config(s)
    groups = engines.param_groups(net.parameters(), s)       # the optimizer's groups, as the HF Trainer or OpenRLHF
    client = engines.optimizer(groups, s) if s.client_optimizer else None
    if client is None and not config["optimizer"]["params"].get("torch_adam"):
        deepspeed_ops.ensure(deepspeed_ops.op_for(s.offload_optimizer))
    engine, optimizer, _, _ = deepspeed.initialize(model=net, optimizer=client, config=config,
                                                   model_parameters=None if client is not None else groups)
    return engine, optimizer, config


def adam_name(config: dict) -> str:
    """Which Adam a DeepSpeed configuration runs, as a result's engine line says it."""
    offload = "offload_optimizer" in config["zero_optimization"]
    if config["optimizer"]["params"].get("torch_adam"):
        return (f"torch AdamW (fused) through DeepSpeed's torch_adam in place of "
                f"{'DeepSpeedCPUAdam' if offload else 'FusedAdam'} (no C++ build)")
    return "DeepSpeedCPUAdam" if offload else "FusedAdam"


def result_from_census(twin, s, tracker, losses, rss, wall, engine, ranks, times=None) -> Result:
    """A scaled run's Result from the tracker's census (host per node of `ranks`), losses, RSS and timings."""
    m = models.spec(str(twin))
    return Result(
        model=m.name, params=m.params, mode="scaled", setup=dataclasses.asdict(s),
        gpu=DeviceMemory(tracker.breakdown("gpu")), host=DeviceMemory(tracker.breakdown("host", ranks)),
        meta={"date": datetime.datetime.now().isoformat(timespec="seconds"), "versions": provenance.versions(),
              "versioned": library_versions.applied(s, m),
              "device": f"CPU ({platform.machine()}, {os.cpu_count()} cores): placement by role, GPU and host are one RAM",
              "engine": engine, "losses": losses, "rss_bytes": rss, "wall_s": round(wall, 2),
              "step_s": [round(x, 5) for x in (times or {}).get("step", [])],
              "phase_s": {k: [round(x, 5) for x in v] for k, v in (times or {}).items()},
              "note": ""},
    )


def _run_torchrun(twin: Path, s: TrainSetup, steps: int) -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={s.gpus}",
               f"--master_port={procgroup.free_port()}", "-m", "helpers.measure.fsdp_worker", "--twin", str(twin),
               "--setup", json.dumps(dataclasses.asdict(s)), "--steps", str(steps), "--out", str(out)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        children.run(cmd, env, timeout=TORCHRUN_TIMEOUT_S, what=f"the {s.strat.title} run under torchrun")
        if not out.exists():
            raise MeasurementError(f"the {s.strat.title} run under torchrun exited without writing its result")
        return Result.from_dict(json.loads(out.read_text()))


REAL_ENGINES = {"torch": TorchEngine, "deepspeed": DeepSpeedEngine, "fsdp2": FSDP2Engine, "fsdp1": FSDP1Engine}
"""The engine that runs each strategy for real (scaled runs and GPU mode), keyed by `Strategy.engine`."""


def engine_class(setup: TrainSetup):
    """The real engine of `setup`'s strategy: called as engine_class(setup)(net, setup, tracker, device_type)."""
    return REAL_ENGINES[setup.strat.engine]
