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
    NCCL buffers), and meta['allocator']: the replay's figures, its sources and, with a capacity, the verdict of a
    second replay capped at the capacity less the overhead (the allocator frees its cache before it gives up)."""
    config = allocator.Config.parse(alloc_conf)
    s = result.setup
    parts = gpus.overhead(s["strategy"], s["gpus"], gpu)
    started = time.perf_counter()
    free = allocator.replay(events, config)
    info = {"config": str(config), "rules": allocator.SOURCE, "phases": free.phases, "segments": free.segments,
            "events": free.events, "replay_s": round(time.perf_counter() - started, 3),
            "cuda_context": gpus.cuda_context(gpu), "nccl_buffers": gpus.nccl_buffers(s["strategy"], s["gpus"]),
            "verdict": None}
    result.gpu.reserved, result.gpu.overhead = free.reserved(), parts
    cap = result.gpu.capacity_bytes
    if cap:
        info["verdict"] = _verdict(events, config, cap, parts, result.gpu.device_total)
    result.meta["allocator"] = info
    return result


def _verdict(events, config, cap: int, parts: dict[str, int], totals: dict[str, int]) -> dict:
    """{'fits', 'phase', 'part', 'requested_bytes', 'released_cache'}: replayed with CUDA's memory capped at the capacity
    less the context and NCCL; `part` names what took it over (gpus.pushed_over)."""
    if max(totals.values(), default=0) <= cap:
        return {"fits": True, "phase": None, "part": None, "released_cache": False}
    capped = allocator.replay(events, config, cap - sum(parts.values()))
    if capped.oom is None:
        return {"fits": True, "phase": None, "part": None, "released_cache": True}
    o = capped.oom
    part = gpus.pushed_over(o["allocated"] + o["requested_bytes"], o["reserved"] + o["segment_bytes"], parts, cap)
    return {"fits": False, "phase": o["phase"], "part": part or "fragmentation", "requested_bytes": o["requested_bytes"],
            "allocated_bytes": o["allocated"], "reserved_bytes": o["reserved"], "released_cache": True}
