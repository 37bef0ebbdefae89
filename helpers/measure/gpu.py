"""GPU runs: the full-size step for real on CUDA, through the set-up's engine.

Per phase: the tracker's census (same categories as everywhere) and torch.cuda's own peak statistics (allocated
and reserved, so the allocator's caching and fragmentation show; reserved per phase becomes `gpu.reserved`), and
torch.cuda.mem_get_info (the device's used bytes and the part outside the allocator: CUDA context, NCCL); the
allocator's segments at the end (torch.cuda.memory_snapshot) and the allocator model replayed on the same run's
allocations (meta 'allocator_model'), so the model can be compared with the GPU wherever one runs; a memory snapshot
file that PyTorch's memory viewer (https://pytorch.org/memory_viz) opens; an out-of-memory is caught, reported with its phase, and its memory
freed, so the process (a notebook kernel) goes on. One GPU per process: multi-GPU set-ups are launched with
`torchrun --nproc_per_node N -m helpers measure --mode gpu ...` (ddp, fsdp2, fsdp1) or
`deepspeed --num_gpus N --module helpers measure --mode gpu ...` (zero1-3), with the same flags; rank 0 reports.
Without CUDA it stops with a message saying so.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import os
import platform
import re
import time
from pathlib import Path

import torch

from helpers import models, provenance
from helpers.errors import InputError, MeasurementError
from helpers.estimate import reference
from helpers.measure import engines, fakegpu, nf4, procgroup, reserved, scaled
from helpers.measure.scaled import check_steps
from helpers.measure.steps import Hooks, run_steps
from helpers.measure.tracker import Tracker
from helpers.results import DeviceMemory, Result
from helpers.training import TrainSetup, checked
from helpers.units import UNITS


def require_cuda(setup: TrainSetup) -> None:
    """InputError unless a CUDA GPU is here and the process layout fits the set-up."""
    if not torch.cuda.is_available():
        raise InputError(
            f"mode 'gpu' needs a CUDA GPU, and this machine has none (torch {torch.__version__}); "
            f"--mode dry-run runs the full-size step on fake tensors, --mode scaled a tiny twin for real")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if setup.gpus != world:
        launcher = setup.strat.launcher
        raise InputError(f"gpus={setup.gpus} but this is {world} process(es): run one process per GPU with "
                         f"`{launcher} helpers measure --mode gpu --gpus N ...`")


def _build(config_path: str, setup: TrainSetup, device: torch.device):
    """The full-size model, initialised (random weights) directly on `device` (this GPU). A 4-bit base is made whole
    in 16 bits there and then quantised, so the setup phase's peak is this builder's, not a user's (transformers'
    from_pretrained quantises tensor by tensor): Llama 3 8B held 13 GiB more at setup than at any training phase on
    an H200. Made on the host instead, its random initialisation outran four minutes there."""
    dtype = torch.bfloat16 if setup.precision == "bf16" else torch.float32
    with device:
        return engines.build_model(config_path, setup, dtype, "eager" if setup.attention == "eager" else "sdpa")


def run(model, setup: TrainSetup, snapshot: str | None = None, steps: int = 2) -> Result:
    """Run `steps` training steps of the full-size model on this GPU; a Result with mode 'gpu'."""
    setup = checked(setup)
    check_steps(steps)
    engines.refuse_unsupported(setup, "gpu")
    require_cuda(setup)
    m = models.spec(model)
    m.check_lora_rank(setup.lora_rank, setup.lora_targets)
    if fakegpu.registered():                 # CUDA's backward fails in this process (fakegpu.wanted): one of its own
        if not fakegpu.wanted():
            raise MeasurementError("the fake 'gpu' backend was registered in the GPU run's own process, where CUDA's "
                                   "backward then fails (helpers.measure.fakegpu.wanted)")
        return _in_own_process(model if isinstance(model, (str, os.PathLike)) else m.path, setup, snapshot, steps)
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if setup.strat.multi_gpu:
        procgroup.ensure("nccl", setup.gpus)
    if snapshot:
        torch.cuda.memory._record_memory_history(max_entries=200_000)
    try:
        return measure(m, setup, torch.device("cuda", torch.cuda.current_device()), steps, snapshot)
    finally:
        if snapshot:
            torch.cuda.memory._dump_snapshot(snapshot)
            torch.cuda.memory._record_memory_history(enabled=None)


OWN_PROCESS_TIMEOUT_S = 6 * 3600      # a GPU run of a large model under offload takes long; a hung one ends here


def _in_own_process(model, setup: TrainSetup, snapshot: str | None, steps: int) -> Result:
    """`run` in a fresh Python process (CUDA_PROCESS_ENV set, so no fake 'gpu' there), its Result read back: what a
    notebook kernel or a CLI that has imported `helpers.measure` gets. The process starts from an empty device, so
    the CUDA context it measures is its own; under torchrun each rank's process starts its own."""
    import json
    import sys
    import tempfile

    import helpers
    from helpers.measure import children

    root = str(Path(helpers.__file__).resolve().parents[1])
    env = {**os.environ, fakegpu.CUDA_PROCESS_ENV: "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory() as tmp:
        args, out = Path(tmp) / "run.json", Path(tmp) / "result.json"
        args.write_text(json.dumps({"model": str(model), "setup": dataclasses.asdict(setup), "snapshot": snapshot,
                                    "steps": steps, "out": str(out)}))
        children.run([sys.executable, "-m", "helpers.measure.gpu", str(args)], env, OWN_PROCESS_TIMEOUT_S,
                     "the GPU run (a process of its own)")
        return Result.from_dict(json.loads(out.read_text()))


def measure(m: models.ModelSpec, setup: TrainSetup, device: torch.device, steps: int = 2,
            snapshot: str | None = None) -> Result:
    """The phases of `steps` steps on `device`, an out-of-memory caught in any of them. `run` calls it on CUDA; on
    another device (the tests' CPU) the control flow is the same and the torch.cuda statistics are left out.

    An OOM (torch.OutOfMemoryError, what the CUDA allocator raises) ends the run: the phase it happened in, the bytes
    it asked for (read from the allocator's message), torch.cuda's statistics at that moment and the message are in
    meta['oom_observed']; the model, engine and batch are dropped and the cache emptied, so the process goes on; the
    verdict says OOM (Result.oom reads it)."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    started, oom = time.perf_counter(), None
    tracker = Tracker()
    hooks = _CudaStats(cuda)
    engine = net = ref = ids = None
    try:
        with tracker:
            net = _build(m.path, setup, device)
            with device:                      # DPO's (KTO's) frozen copy, as the scaled run builds it
                ref = scaled.build_reference(Path(m.path), setup)
            engine = scaled.engine_class(setup)(net, setup, tracker, device.type,
                                                **({"reference": ref} if setup.run in scaled.REFERENCE_RUNS else {}))
            tracker.label(list(net.buffers()) + [p for p in net.parameters() if not p.requires_grad]
                          + nf4.state_tensors(net), "parameters")
            tracker.restart_peak("setup")
            hooks.stats["setup"] = _cuda_stats(cuda)
            ids = torch.randint(0, m.vocab, (reference.pairs(setup).batch, setup.seq), device=device)
            engines.watch_logits(engine.module, tracker)
            with nf4.matmul_as(setup), engines.kv_expanded(setup):
                run_steps(engine, tracker, ids, setup.grad_accum, steps, hooks=hooks)
    except torch.OutOfMemoryError as exc:
        message = str(exc).strip()
        oom = {"device": "gpu", "phase": hooks.phase, "message": message.splitlines()[0] if message else "",
               "requested_bytes": requested_bytes(message), "cuda_stats": _cuda_now(cuda)}
    stats, step_s = hooks.stats, hooks.step_s
    describe = getattr(engine, "describe", setup.strategy)
    if oom is not None:                       # after the except block: its traceback no longer holds the tensors
        engine = net = ref = ids = None
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            oom["cuda_stats_after_freeing"] = _cuda_now(cuda)
    capacity = torch.cuda.get_device_properties(device).total_memory if cuda else None
    breakdown = tracker.breakdown("gpu")
    held = {p: stats[p]["max_reserved"] for p in breakdown if "max_reserved" in stats.get(p, {})} or None
    outside = stats.get("setup", {}).get("outside_allocator")
    model = reserved.replay(reserved.events_from(tracker))       # the allocator model on this very run, to compare
    return Result(
        model=m.name, params=m.params, mode="gpu", setup=dataclasses.asdict(setup),
        gpu=DeviceMemory(breakdown, capacity, held, None if outside is None else {"outside_allocator": outside}),
        host=DeviceMemory(tracker.breakdown("host", setup.ranks_per_node)),
        meta={"date": datetime.datetime.now().isoformat(timespec="seconds"), "versions": provenance.versions(),
              "device": torch.cuda.get_device_name(device) if cuda else str(device), "engine": describe,
              "cuda_stats": stats, "oom_observed": oom, "step_s": step_s, "snapshot": snapshot,
              "segments": segments_summary(torch.cuda.memory_snapshot()) if cuda else None,
              "allocator_model": model.to_dict(),
              "wall_s": round(time.perf_counter() - started, 2), "machine": platform.machine()},
    )


class _CudaStats(Hooks):
    """GPU mode's record of the shared loop: torch.cuda's peaks per phase (reset before each phase), the optimizer
    steps' wall times (synchronised), and the phase running now (an OOM names it)."""

    def __init__(self, cuda: bool):
        self.cuda, self.phase, self.stats, self.step_s, self.started = cuda, "setup", {}, [], 0.0

    def before(self, phase, activity):
        self.phase = phase
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            torch.cuda.synchronize()
        self.started = time.perf_counter()

    def after(self, phase, activity, seconds):
        if activity == "step":
            if self.cuda:
                torch.cuda.synchronize()
            self.step_s.append(round(time.perf_counter() - self.started, 4))
        self.stats[phase] = _cuda_stats(self.cuda, self.stats.get(phase))


def requested_bytes(message: str) -> int | None:
    """The allocation an OOM asked for, from the CUDA allocator's 'Tried to allocate 2.00 GiB' (None if absent)."""
    found = re.search(r"Tried to allocate ([0-9.]+) ?(bytes|B|KiB|MiB|GiB|TiB|PiB)\b", message)
    return int(round(float(found.group(1)) * UNITS[found.group(2)])) if found else None


def _cuda_now(cuda: bool) -> dict:
    """torch.cuda's statistics at this moment (empty without CUDA)."""
    if not cuda:
        return {}
    free, total = torch.cuda.mem_get_info()
    return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
            "max_allocated": torch.cuda.max_memory_allocated(), "max_reserved": torch.cuda.max_memory_reserved(),
            "free": free, "total": total}


def _cuda_stats(cuda: bool, previous: dict | None = None) -> dict:
    """torch.cuda's peak allocated and reserved bytes since the last reset (the larger of this and `previous`), and
    from torch.cuda.mem_get_info at the phase's end: the device's used bytes (what nvidia-smi shows, every process)
    and the part outside this allocator (CUDA context, NCCL, other processes); empty without CUDA."""
    if not cuda:
        return {}
    free, total = torch.cuda.mem_get_info()
    now = {"max_allocated": torch.cuda.max_memory_allocated(), "max_reserved": torch.cuda.max_memory_reserved(),
           "device_used": total - free, "outside_allocator": total - free - torch.cuda.memory_reserved()}
    return {k: max(v, (previous or {}).get(k, 0)) for k, v in now.items()}


def segments_summary(snapshot: list[dict]) -> dict:
    """The caching allocator's segments from torch.cuda.memory_snapshot(): their count and bytes by pool ('large' /
    'small'), allocated bytes in them, and the largest free block (bytes) - to set beside the allocator model."""
    out = {"segments": len(snapshot), "reserved": 0, "allocated": 0, "largest_free_block": 0,
           "by_pool": {"large": 0, "small": 0}, "expandable": any(s.get("is_expandable") for s in snapshot)}
    for seg in snapshot:
        out["reserved"] += seg["total_size"]
        out["allocated"] += seg["allocated_size"]
        out["by_pool"]["large" if seg["segment_type"] == "large" else "small"] += seg["total_size"]
        free = [b["size"] for b in seg["blocks"] if b["state"] == "inactive"]
        out["largest_free_block"] = max([out["largest_free_block"], *free])
    return out


if __name__ == "__main__":          # the process `_in_own_process` starts: one run, its Result written as JSON
    import json
    import sys

    from helpers.files import write_text_atomically

    job = json.loads(Path(sys.argv[1]).read_text())
    done = run(job["model"], TrainSetup(**job["setup"]), job["snapshot"], job["steps"])
    write_text_atomically(Path(job["out"]), json.dumps(done.to_dict()))
