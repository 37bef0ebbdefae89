"""GPU runs: the full-size step for real on CUDA, through the set-up's engine.

Per phase: the tracker's census (same categories as everywhere) and torch.cuda's own peak statistics (allocated
and reserved, so the allocator's caching and fragmentation show); a memory snapshot file that PyTorch's memory
viewer (https://pytorch.org/memory_viz) opens; an out-of-memory is caught, reported with its phase, and its memory
freed, so the process (a notebook kernel) goes on. One GPU per process: multi-GPU set-ups are launched with
`torchrun --nproc_per_node N -m helpers measure --mode gpu ...` (ddp, fsdp2) or
`deepspeed --num_gpus N --module helpers measure --mode gpu ...` (zero1-3), with the same flags; rank 0 reports.
Without CUDA it stops with a message saying so.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import os
import platform
import time

import torch

from helpers import models
from helpers.errors import InputError
from helpers.measure import engines, procgroup
from helpers.measure.scaled import DeepSpeedEngine, TorchEngine, _versions
from helpers.measure.tracker import Tracker
from helpers.results import DeviceMemory, Result
from helpers.training import TrainSetup


def require_cuda(setup: TrainSetup) -> None:
    """InputError unless a CUDA GPU is here and the process layout fits the set-up."""
    if not torch.cuda.is_available():
        raise InputError(
            f"mode 'gpu' needs a CUDA GPU, and this machine has none (torch {torch.__version__}); "
            f"--mode dry-run runs the full-size step on fake tensors, --mode scaled a tiny twin for real")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if setup.gpus != world:
        launcher = "deepspeed --num_gpus N --module" if setup.strategy.startswith("zero") else \
            "torchrun --nproc_per_node N -m"
        raise InputError(f"gpus={setup.gpus} but this is {world} process(es): run one process per GPU with "
                         f"`{launcher} helpers measure --mode gpu --gpus N ...`")


def _build_on_cuda(config_path: str, setup: TrainSetup):
    """The full-size model, initialised (random weights) directly on this GPU."""
    dtype = torch.bfloat16 if setup.precision == "bf16" else torch.float32
    with torch.device("cuda", torch.cuda.current_device()):
        return engines.build_model(config_path, setup, dtype, "eager" if setup.attention == "eager" else "sdpa")


def run(model, setup: TrainSetup, snapshot: str | None = None, steps: int = 2) -> Result:
    """Run `steps` training steps of the full-size model on this GPU; a Result with mode 'gpu'."""
    setup = setup.validate()
    engines.refuse_unsupported(setup, "gpu")
    require_cuda(setup)
    m = models.spec(model)
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if setup.strategy != "single":
        procgroup.ensure("nccl", setup.gpus)
    if snapshot:
        torch.cuda.memory._record_memory_history(max_entries=200_000)
    torch.cuda.reset_peak_memory_stats()
    started, stats, oom, step_s = time.perf_counter(), {}, None, []
    tracker = Tracker()
    engine = None
    try:
        with tracker:
            net = _build_on_cuda(m.path, setup)
            if setup.strategy == "fsdp2":
                from helpers.measure.fsdp_worker import FSDP2Engine
                engine = FSDP2Engine(net, setup, tracker, device_type="cuda")
            elif setup.strategy.startswith("zero"):
                engine = DeepSpeedEngine(net, setup, tracker)
            else:
                engine = TorchEngine(net, setup, tracker)
            tracker.restart_peak("setup")
            stats["setup"] = _cuda_stats()
            ids = torch.randint(0, m.vocab, (setup.batch, setup.seq), device="cuda")
            engines.watch_logits(engine.module, tracker)
            for i in range(steps):
                for phase, call in (("forward", lambda: engine.forward(ids)), ("backward", None), ("step", None)):
                    name = phase if (i == 0 or phase == "step") else "steady"
                    torch.cuda.reset_peak_memory_stats()
                    torch.cuda.synchronize()
                    phase_started = time.perf_counter()
                    with tracker.phase(name, activity=phase):
                        if phase == "forward":
                            loss = call()
                        elif phase == "backward":
                            engine.backward(loss)
                            del loss
                        else:
                            engine.step()
                    if phase == "step":
                        torch.cuda.synchronize()
                        step_s.append(round(time.perf_counter() - phase_started, 4))
                    stats[name] = _cuda_stats(stats.get(name))
    except torch.OutOfMemoryError as exc:
        oom = {"phase": tracker._phase, "message": str(exc).splitlines()[0]}
        engine = net = None
        gc.collect()
        torch.cuda.empty_cache()
    finally:
        if snapshot:
            torch.cuda.memory._dump_snapshot(snapshot)
            torch.cuda.memory._record_memory_history(enabled=None)
    capacity = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return Result(
        model=m.name, params=m.params, mode="gpu", setup=dataclasses.asdict(setup),
        gpu=DeviceMemory(tracker.breakdown("gpu"), capacity),
        host=DeviceMemory(tracker.breakdown("host", setup.ranks_per_node)),
        meta={"date": datetime.datetime.now().isoformat(timespec="seconds"), "versions": _versions(),
              "device": torch.cuda.get_device_name(), "engine": getattr(engine, "describe", setup.strategy),
              "cuda_stats": stats, "oom_observed": oom, "step_s": step_s, "snapshot": snapshot,
              "wall_s": round(time.perf_counter() - started, 2), "machine": platform.machine()},
    )


def _cuda_stats(previous: dict | None = None) -> dict:
    """torch.cuda's peak allocated and reserved bytes since the last reset (the larger of this and `previous`)."""
    now = {"max_allocated": torch.cuda.max_memory_allocated(), "max_reserved": torch.cuda.max_memory_reserved()}
    return {k: max(v, (previous or {}).get(k, 0)) for k, v in now.items()}
