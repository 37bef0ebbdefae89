"""The reserved view of a run: the allocator model (`allocator`) replayed on its allocations, plus what a GPU holds
beyond the allocator (`helpers.gpus`), and a verdict on the device total against the capacity.

Evidence kind: *modelled* - PyTorch's caching-allocator rules (our reading of its source) applied to the step's own
allocations and frees; a GPU run (`--mode gpu`) records the real figures beside it.
"""

from __future__ import annotations

import time

from helpers import gpus
from helpers.measure import allocator
from helpers.results import Result


def attach(result: Result, events: list[tuple], gpu: str | None = None, alloc_conf: str | None = None) -> Result:
    """Set result.gpu.reserved (the model's per-phase reserved bytes, with room to grow) and .overhead (CUDA context,
    NCCL buffers), and meta['allocator']: the replay's figures, its sources, the reserve under
    expandable_segments:True beside the default's ('reserved_expandable') and, with a capacity, the verdict of a
    replay capped at the capacity less the overhead (the allocator frees its cache before it gives up)."""
    config = allocator.Config.parse(alloc_conf)
    s = result.setup
    parts = gpus.overhead(s["strategy"], s["gpus"], gpu)
    started = time.perf_counter()
    free = allocator.replay(events, config)
    info = {"config": str(config), "rules": allocator.SOURCE, "phases": free.phases, "segments": free.segments,
            "events": free.events, "replay_s": round(time.perf_counter() - started, 3),
            "cuda_context": gpus.cuda_context(gpu), "nccl_buffers": gpus.nccl_buffers(s["strategy"], s["gpus"]),
            "verdict": None}
    if not config.expandable_segments:       # the one setting that changes it most, beside (bytes per phase)
        info["reserved_expandable"] = allocator.replay(events, allocator.Config(expandable_segments=True)).reserved()
    result.gpu.reserved, result.gpu.overhead = free.reserved(), parts
    cap = result.gpu.capacity_bytes
    if cap:
        info["verdict"] = _verdict(events, config, cap, parts, result.gpu.device_total, result.gpu.peak_bytes)
    result.meta["allocator"] = info
    return result


def _verdict(events, config, cap: int, parts: dict[str, int], totals: dict[str, int], tensors: int) -> dict:
    """{'fits', 'phase', 'part', 'requested_bytes', 'released_cache'}: replayed with CUDA's memory capped at the capacity
    less the context and NCCL; `part` names what took it over (gpus.pushed_over on the step's peaks: the tensors'
    bytes, then the context and NCCL, then the allocator's fragmentation)."""
    if max(totals.values(), default=0) <= cap:
        return {"fits": True, "phase": None, "part": None, "released_cache": False}
    capped = allocator.replay(events, config, cap - sum(parts.values()))
    if capped.oom is None:
        return {"fits": True, "phase": None, "part": None, "released_cache": True}
    o = capped.oom
    part = gpus.pushed_over(tensors, max(totals.values()) - sum(parts.values()), parts, cap)
    return {"fits": False, "phase": o["phase"], "part": part or "fragmentation", "requested_bytes": o["requested_bytes"],
            "allocated_bytes": o["allocated"], "reserved_bytes": o["reserved"], "released_cache": True}


def recheck(model: str, setup, gpu: str | None = None, alloc_conf: str | None = None) -> dict:
    """A set-up's GPU verdict on allocated bytes and on the device total (bytes): from a dry run with the allocator
    model where the strategy has a dry run, else from the estimate plus the context and NCCL (reserved not modelled:
    said in 'basis'). 'flipped' is True where the two verdicts differ."""
    from helpers import estimate
    from helpers.measure import dryrun

    has_dry = setup.strategy in dryrun.STEPS and setup.optimizer == "adamw"
    r = dryrun.run(model, setup, progress=False, gpu=gpu, alloc_conf=alloc_conf) if has_dry else \
        estimate.run(model, setup)
    parts = gpus.overhead(setup.strategy, setup.gpus, gpu)
    allocated, cap = r.gpu.peak_bytes, r.gpu.capacity_bytes
    if has_dry:
        reserved_peak = max(r.gpu.reserved.values())
        v = r.meta["allocator"]["verdict"] or {"fits": True, "part": None}
        fits_device, part = v["fits"], v["part"]
        basis = "dry run + allocator model (reserved modelled) + context + NCCL"
    else:
        reserved_peak = None
        part = gpus.pushed_over(allocated, allocated, parts, cap) if cap else None
        fits_device = part is None
        basis = (f"estimate + context + NCCL: no dry run of {setup.strategy}, so the allocator's reserve is not "
                 f"modelled (a lower bound)")
    fits_allocated = cap is None or r.oom["device"] != "gpu"
    return {"model": model, "allocated": allocated, "reserved": reserved_peak, "overhead": parts,
            "device_total": (reserved_peak if reserved_peak is not None else allocated) + sum(parts.values()),
            "capacity": cap, "fits_allocated": fits_allocated, "fits_device": fits_device, "part": part,
            "flipped": fits_allocated != fits_device, "basis": basis, "result": r}
