"""The reserved view of a run: its allocations and frees (the tracker's event log) replayed through the allocator
model (`allocator`), per phase: allocated, reserved, the largest free block and fragmentation; plus what a GPU holds
beyond the allocator (`helpers.gpus`), and a verdict on the device total against the capacity.

Evidence kind: *modelled* - PyTorch's caching-allocator rules (our reading of its source) applied to the step's own
allocations and frees; a GPU run (`--mode gpu`) records the real figures beside it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from helpers import gpus
from helpers.measure import allocator
from helpers.results import Result


@dataclass
class Replay:
    """Per phase, at its highest moments (bytes): allocated (block sizes, as torch.cuda.memory_allocated counts them),
    requested (the tensors' own bytes), reserved (segments), fragmentation (reserved - allocated) and the largest
    free cached block at the allocated peak; `oom` if the limit was hit (the phase, the bytes asked for)."""

    config: str
    limit_bytes: int | None
    phases: dict[str, dict[str, int]] = field(default_factory=dict)
    oom: dict | None = None
    segments: int = 0
    events: int = 0
    peak_allocated: int = 0
    peak_event: int = -1
    """The highest allocated bytes of the whole replay, and the index of the event that reached it."""

    def reserved(self) -> dict[str, int]:
        return {p: v["reserved"] for p, v in self.phases.items()}

    def to_dict(self) -> dict:
        return {"config": self.config, "limit_bytes": self.limit_bytes, "phases": self.phases, "oom": self.oom,
                "segments": self.segments, "events": self.events, "rules": allocator.SOURCE}


def events_from(tracker, device: str = "gpu") -> list[tuple]:
    """The tracker's event log as allocator events: ('phase', name), ('restart', name), ('resize', key, new_bytes).

    A storage first seen is a 'resize' from 0; a free is a resize to 0; a storage resized in place (FSDP2's all-gather
    buffers) is a new block allocated before the old one is freed, as `resize_` does."""
    out, size = [], {}
    for ev in tracker.events:
        if ev[0] in ("phase", "restart"):
            out.append(ev)
            continue
        rec, delta = ev
        if rec.device != device:
            continue
        key = id(rec)
        new = size.get(key, 0) + delta
        size[key] = new
        out.append(("resize", key, new))
    return out


def from_trace(trace: list) -> tuple[list[tuple], int, int]:
    """A real CUDA allocator trace ([action, address, bytes], as torch.cuda.memory._snapshot()'s device_traces give
    it: data/results/gpu_traces) as (replay's events, the GPU's peak reserved bytes, the segments it cudaMalloc'd)."""
    events, held, peak, segments = [], 0, 0, 0
    for action, addr, size in trace:
        if action == "segment_alloc":
            held, segments = held + size, segments + 1
            peak = max(peak, held)
        elif action == "segment_free":
            held -= size
        elif action == "alloc":
            events.append(("resize", addr, size))
        elif action == "free_completed":
            events.append(("resize", addr, 0))
    return events, peak, segments


def replay(events: list[tuple], config: allocator.Config = allocator.Config(), limit_bytes: int | None = None,
           until: int | None = None, keep: dict | None = None) -> Replay:
    """Run allocator events (`events_from`'s, plus ('empty_cache',) for torch.cuda.empty_cache()) through a
    CachingAllocator; the per-phase figures (bytes), and where it ran out. `until`: stop after that event's index;
    `keep`: a dict that receives the allocator, its live blocks ({key: (block, bytes)}) and the phase where the
    replay stopped (at `until`, at an out-of-memory, or at the end), for a snapshot of that moment."""
    alloc = allocator.CachingAllocator(config, limit_bytes)
    result = Replay(str(config), limit_bytes, events=len(events))
    live: dict[int, tuple[allocator.Block, int]] = {}
    phase, peak_alloc = "setup", -1
    phases = result.phases

    def open_phase(name: str) -> dict:
        nonlocal peak_alloc
        peak_alloc = alloc.allocated
        phases[name] = {"allocated": alloc.allocated, "requested": alloc.requested, "reserved": alloc.reserved,
                        "largest_free": alloc.largest_free(), "fragmentation": alloc.reserved - alloc.allocated}
        return phases[name]

    stats = open_phase("setup")
    for index, ev in enumerate(events):
        if until is not None and index > until:
            break
        kind = ev[0]
        if kind == "resize":
            _, key, new = ev
            old = live.pop(key, None)
            if new > 0:
                try:
                    live[key] = (alloc.malloc(new), new)
                except allocator.OutOfMemory as exc:
                    if old is not None:
                        live[key] = old                     # still allocated: resize_ had not freed it yet
                    result.oom = {"phase": phase, "requested_bytes": exc.requested, "segment_bytes": exc.segment,
                                  "allocated": alloc.allocated, "reserved": alloc.reserved}
                    break
                alloc.requested += new
                if stats is not None:               # the peak is while the old block still lives
                    if alloc.reserved > stats["reserved"]:
                        stats["reserved"] = alloc.reserved
                    if alloc.allocated > peak_alloc:
                        peak_alloc = alloc.allocated
                        if alloc.allocated > result.peak_allocated:
                            result.peak_allocated, result.peak_event = alloc.allocated, index
                        stats.update(allocated=alloc.allocated, requested=alloc.requested,
                                     largest_free=alloc.largest_free())
                    stats["fragmentation"] = stats["reserved"] - stats["allocated"]
            if old is not None:
                alloc.free(old[0])
                alloc.requested -= old[1]
        elif kind == "phase":
            phase = ev[1]
            stats = None if phase == "_between" else (phases.get(phase) or open_phase(phase))
            if stats is not None:
                peak_alloc = stats["allocated"]
        elif kind == "restart":
            phase = ev[1]
            stats = open_phase(phase)
        elif kind == "empty_cache":
            alloc.empty_cache()
    result.segments = alloc.segments
    if keep is not None:
        keep.update(alloc=alloc, live=live, phase=phase)
    return result


def attach(result: Result, events: list[tuple], gpu: str | None = None, alloc_conf: str | None = None) -> Result:
    """Set result.gpu.reserved (the model's per-phase reserved bytes, with room to grow) and .overhead (CUDA context,
    NCCL buffers), and meta['allocator']: the replay's figures, its sources, the reserve under
    expandable_segments:True beside the default's ('reserved_expandable') and, with a capacity, the verdict of a
    replay capped at the capacity less the overhead (the allocator frees its cache before it gives up)."""
    config = allocator.Config.parse(alloc_conf)
    s = result.setup
    parts = gpus.overhead(s["strategy"], s["gpus"], gpu)
    started = time.perf_counter()
    free = replay(events, config)
    info = {"kind": "modelled: PyTorch's caching-allocator rules replayed on this run's allocations",
            "config": str(config), "rules": allocator.SOURCE, "phases": free.phases, "segments": free.segments,
            "events": free.events, "replay_s": round(time.perf_counter() - started, 3),
            "cuda_context": gpus.cuda_context(gpu), "nccl_buffers": gpus.nccl_buffers(s["strategy"], s["gpus"]),
            "verdict": None}
    if not config.expandable_segments:       # the one setting that changes it most, beside (bytes per phase)
        info["reserved_expandable"] = replay(events, allocator.Config(expandable_segments=True)).reserved()
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
    capped = replay(events, config, cap - sum(parts.values()))
    if capped.oom is None:
        return {"fits": True, "phase": None, "part": None, "released_cache": True}
    o = capped.oom
    part = gpus.pushed_over(tensors, max(totals.values()) - sum(parts.values()), parts, cap)
    return {"fits": False, "phase": o["phase"], "part": part or "fragmentation", "requested_bytes": o["requested_bytes"],
            "allocated_bytes": o["allocated"], "reserved_bytes": o["reserved"], "released_cache": True}
