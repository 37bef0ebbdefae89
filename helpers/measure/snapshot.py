"""A memory snapshot in PyTorch's own format, written from the allocator model replayed on a dry run's allocations.

`write(path, events, labels, ...)` replays a dry run's allocator events (`reserved.events_from`) through the
caching-allocator model, stops at the out-of-memory when a capacity is given and the replay runs out (else at the
moment of its highest allocated bytes), and writes the allocator's state as `torch.cuda.memory._dump_snapshot` would:
{'segments': [...], 'device_traces': [[...]]}, each segment tiled by its blocks in address order (what
torch/cuda/_memory_viz.py and https://pytorch.org/memory_viz need), each allocated block with one frame naming what
the tracker called it (filename '<helpers: allocator model>', name: its category, phase and context), and after an
out-of-memory an 'oom' trace entry with the size asked for and the bytes CUDA had left. It opens in PyTorch's memory
viewer, and `helpers.snapshots.load` reads it back.

Evidence kind: modelled (the allocator's rules on the step's own allocations); addresses are the model's.
"""

from __future__ import annotations

import pickle
from pathlib import Path

from helpers.measure import allocator, reserved

OWN_FRAME = "<helpers: allocator model>"       # the filename of the one frame each block written here carries


def state(events: list[tuple], config: allocator.Config, limit_bytes: int | None) -> tuple[dict, dict | None]:
    """The allocator's state ({'alloc', 'live', 'phase'}) at the out-of-memory of a replay capped at `limit_bytes`,
    else at the replay's highest allocated moment; and the out-of-memory (None when it fits)."""
    keep: dict = {}
    first = reserved.replay(events, config, limit_bytes, keep=keep)
    if first.oom is not None:
        return keep, first.oom
    keep = {}
    reserved.replay(events, config, None, until=first.peak_event, keep=keep)
    return keep, None


def to_torch(keep: dict, labels: dict, oom: dict | None, limit_bytes: int | None) -> dict:
    """The state as torch's snapshot dict (2.1+ layout): segments with their blocks in address order."""
    alloc: allocator.CachingAllocator = keep["alloc"]
    owner = {id(block): key for key, (block, _) in keep["live"].items()}
    requested = {id(block): n for block, n in keep["live"].values()}
    blocks = [b for b, _ in keep["live"].values()]
    for pool in (alloc.small, alloc.large):
        blocks += list(pool.blocks.values())
    heads = {}
    for b in blocks:
        h = b
        while h.prev is not None:
            h = h.prev
        heads[id(h)] = h
    segments = []
    for h in sorted(heads.values(), key=lambda x: x.addr):
        out, b = [], h
        while b is not None:
            if b.mapped:
                live = b.allocated
                key = owner.get(id(b))
                out.append({"address": b.addr, "size": b.size,
                            "requested_size": requested.get(id(b), b.size) if live else 0,
                            "state": "active_allocated" if live else "inactive",
                            "frames": [{"filename": OWN_FRAME, "line": 0, "name": labels.get(key, "unlabelled")}]
                            if live else []})
            b = b.next
        if not out:
            continue
        total = sum(x["size"] for x in out)
        alloc_bytes = sum(x["size"] for x in out if x["state"] == "active_allocated")
        segments.append({"device": 0, "address": h.addr, "total_size": total, "allocated_size": alloc_bytes,
                         "active_size": alloc_bytes, "requested_size": sum(x["requested_size"] for x in out),
                         "stream": 0, "segment_type": "small" if h.pool.small else "large", "segment_pool_id": (0, 0),
                         "is_expandable": alloc.config.expandable_segments, "frames": [], "blocks": out})
    trace = []
    if oom is not None:
        free = None if limit_bytes is None else max(0, limit_bytes - alloc.reserved)
        trace.append({"action": "oom", "addr": 0, "device_free": free, "size": oom["requested_bytes"], "stream": 0,
                      "frames": [{"filename": OWN_FRAME, "line": 0, "name": f"out of memory at the {oom['phase']}"}]})
    return {"segments": segments, "device_traces": [trace], "allocator_settings": {"source": allocator.SOURCE,
                                                                                   "config": str(alloc.config)}}


def labels_of(tracker) -> dict:
    """{event key: 'category, made in <activity>[, context]'} for every storage the tracker saw."""
    out = {}
    for ev in tracker.events:
        if ev[0] in ("phase", "restart"):
            continue
        rec = ev[0]
        words = [tracker.category(rec), f"made in {rec.activity}"] + ([rec.context] if rec.context else [])
        out[id(rec)] = ", ".join(words)
    return out


def write(path, events: list[tuple], labels: dict, config: allocator.Config = allocator.Config(),
          limit_bytes: int | None = None) -> dict:
    """Write the snapshot (see the module docstring) to `path`; returns {'path', 'oom', 'phase', 'segments'}."""
    keep, oom = state(events, config, limit_bytes)
    snap = to_torch(keep, labels, oom, limit_bytes)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    with tmp.open("wb") as f:
        pickle.dump(snap, f, protocol=4)
    tmp.replace(p)
    return {"path": str(p), "oom": oom, "phase": keep["phase"], "segments": len(snap["segments"])}
