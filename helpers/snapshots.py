"""PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot`'s pickle) read safely, summarised, and their blocks
named.

A snapshot is the caching allocator's state: segments (what it reserved from CUDA), each tiled by blocks (allocated,
or cached free), and with `_record_memory_history` on, the frames that allocated each block and a trace of allocator
events ending, after an out-of-memory, in an 'oom' entry. `load(path)` reads one with an unpickler that builds only
dicts, lists, strings and numbers (a snapshot holds nothing else; a pickle naming a class is refused, never run) and
normalises the formats torch has written (facts read in torch's torch/cuda/memory.py and torch/cuda/_memory_viz.py
of releases 1.13 to 2.9):
- up to 1.12 a bare list of segments; from 1.13 {'segments', 'device_traces'};
- blocks carry their frames in 'history' (1.13, 2.0: a list of {addr, real_size, frames}) or in 'frames' (2.1+);
- 'requested_size' (the tensor's own bytes; the block is that rounded) from 2.1; block states 'active_allocated',
  'active_pending_free', 'inactive';
- frames are {'filename', 'line', 'name'}; the profiler's route (torch.cuda._memory_viz._profile_to_snapshot, which
  works on a CPU too) writes 'filename' 'none' and 'path(line): function' in 'name', and a 'category' on trace entries.

`summary(snap)` gives reserved, allocated, cached free, the largest free block and fragmentation; `named(snap, ...)`
names each allocated block: by the category this package's own writer put in its frames, by the profiler's category,
by the frames (an optimizer's, backward's, forward's, loading's) and, given a set-up's candidate buffers
(`helpers.explain.candidates`), by its size.
"""

from __future__ import annotations

import gzip
import io
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path

from helpers.errors import InputError
from helpers.measure.snapshot import OWN_FRAME
from helpers.units import GiB

MAX_BYTES = 2 * GiB
STATES = ("active_allocated", "active_pending_free", "inactive")


class _Plain(pickle.Unpickler):
    """Builds only what a snapshot holds (dict, list, tuple, str, int, float, bool, None): any class refused."""

    def find_class(self, module, name):
        raise InputError(f"not a memory snapshot: the pickle names the Python class {module}.{name} (a snapshot holds "
                         f"only dicts, lists, strings and numbers; nothing in it was run)")


@dataclass
class Block:
    segment: int
    address: int
    size: int
    state: str
    requested: int | None
    frames: list[dict]


@dataclass
class Snapshot:
    """Segments and blocks of one device (the one with the most reserved, or the one asked for), and the trace."""

    path: str
    device: int
    segments: list[dict]
    blocks: list[Block]
    trace: list[dict] = field(default_factory=list)
    devices: list[int] = field(default_factory=list)
    format: str = ""
    profiler: bool = False
    """Written by torch's profiler route: its 'segments' are the span of its tensors' addresses, not the allocator's
    segments, so reserved and free figures do not mean what they mean in an allocator's snapshot."""

    @property
    def oom(self) -> dict | None:
        """The trace's last 'oom' entry ({'size': bytes asked, 'device_free': bytes free}), if any."""
        return next((e for e in reversed(self.trace) if e.get("action") == "oom"), None)


def load(path, device: int | None = None) -> Snapshot:
    """A snapshot from a pickle file (gzip-compressed or not); InputError naming what is wrong with it."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"--snapshot {str(path)!r} is not a file (torch.cuda.memory._dump_snapshot writes one)")
    if p.stat().st_size > MAX_BYTES:
        raise InputError(f"--snapshot {str(path)!r} is {p.stat().st_size / GiB:.1f} GiB; at most 2 GiB are read")
    data = p.read_bytes()
    if data[:2] == b"\x1f\x8b":                   # gzip: inflated a piece at a time, never past MAX_BYTES
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as z:
                data = z.read(MAX_BYTES + 1)
        except (OSError, EOFError) as e:
            raise InputError(f"--snapshot {str(path)!r} is a broken gzip file ({e})") from None
        if len(data) > MAX_BYTES:
            raise InputError(f"--snapshot {str(path)!r} inflates to over {MAX_BYTES / GiB:.0f} GiB; at most that is "
                             f"read")
    if not data.startswith(b"\x80"):
        raise InputError(f"--snapshot {str(path)!r} is not a pickle (torch.cuda.memory._dump_snapshot writes one; a "
                         f"pasted error goes to --message)")
    try:
        raw = _Plain(io.BytesIO(data)).load()
    except InputError:
        raise
    except Exception as e:                    # a truncated or corrupt pickle: any of pickle's many errors
        raise InputError(f"--snapshot {str(path)!r} could not be read as a pickle ({type(e).__name__}: "
                         f"{str(e)[:120]})") from None
    return from_dict(raw, str(path), device)


def from_dict(raw, path: str = "<snapshot>", device: int | None = None) -> Snapshot:
    """A Snapshot from what torch's snapshot functions return (any release's layout)."""
    fmt = "torch 1.13+ ({'segments', 'device_traces'})"
    if isinstance(raw, list):
        raw, fmt = {"segments": raw, "device_traces": []}, "torch 1.12 or earlier (a list of segments)"
    if not isinstance(raw, dict) or not isinstance(raw.get("segments"), list):
        raise InputError(f"{path!r} is not a memory snapshot: expected a dict with 'segments' (and 'device_traces'), "
                         f"as torch.cuda.memory._snapshot() returns, got {type(raw).__name__}"
                         + (f" with keys {sorted(map(str, raw))[:6]}" if isinstance(raw, dict) else ""))
    segs = [s for s in raw["segments"] if isinstance(s, dict)]
    if len(segs) != len(raw["segments"]) or any(not isinstance(s.get("blocks"), list) for s in segs):
        raise InputError(f"{path!r}: every segment must be a dict with a 'blocks' list, as torch writes them")
    devices = sorted({_int(s.get("device", 0), path, "device") for s in segs})
    if device is None:
        by_dev = {d: sum(_int(s.get("total_size", 0), path, "total_size") for s in segs if s.get("device", 0) == d)
                  for d in devices}
        device = max(by_dev, key=by_dev.get) if by_dev else 0
    elif device not in devices:
        raise InputError(f"{path!r} has no segments on device {device}; it has devices {devices}")
    mine = [s for s in segs if s.get("device", 0) == device]
    blocks = []
    for n, s in enumerate(mine):
        addr = s.get("address")
        addr = _int(addr, path, "address") if addr is not None else 0
        for b in s["blocks"]:
            if not isinstance(b, dict):
                raise InputError(f"{path!r}: a block must be a dict with 'size' and 'state', got {type(b).__name__}")
            size = _int(b.get("size"), path, "block size")
            state = b.get("state")
            if state not in STATES:
                raise InputError(f"{path!r}: a block's state must be one of {', '.join(STATES)}, got {state!r}")
            frames = b.get("frames")
            if frames is None and b.get("history"):         # torch 1.13 / 2.0: the frames of its last allocation
                frames = (b["history"][-1] or {}).get("frames")
                if not fmt.startswith("torch 1.12"):
                    fmt = "torch 1.13-2.0 (frames in each block's history)"
            req = b.get("requested_size")
            blocks.append(Block(n, addr, size, state, _int(req, path, "requested_size") if req is not None else None,
                                [_frame(f) for f in frames or [] if isinstance(f, dict)]))
            addr += size
    profiler = any(isinstance(e, dict) and "category" in e for t in (raw.get("device_traces") or [])
                   if isinstance(t, list) for e in t[:50])
    if profiler:
        fmt = "torch's profiler route (_profile_to_snapshot): segments span the addresses its tensors had"
    traces = raw.get("device_traces") or []
    trace = traces[device] if isinstance(traces, list) and device < len(traces) and isinstance(traces[device], list) \
        else []
    return Snapshot(path, device, mine, blocks, [e for e in trace if isinstance(e, dict)], devices, fmt,
                    profiler)


def _int(v, path, what) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise InputError(f"{path!r}: {what} must be a whole number of bytes >= 0, got {v!r}")
    return v


def _frame(f: dict) -> dict:
    """{'filename', 'line', 'name'}; the profiler's 'none' filename with 'path(line): function' in name split."""
    name, filename, line = str(f.get("name", "")), str(f.get("filename", "")), f.get("line", 0)
    m = re.fullmatch(r"(.+?)\((\d+)\): (.+)", name)
    if filename == "none" and m:
        filename, line, name = m.group(1), int(m.group(2)), m.group(3)
    return {"filename": filename, "line": line if isinstance(line, int) else 0, "name": name}


def summary(snap: Snapshot) -> dict:
    """Bytes of the device: reserved (segments), allocated (active blocks), cached free, the largest free block,
    and fragmentation (cached free / reserved); the segment count."""
    reserved = sum(_int(s.get("total_size", 0), snap.path, "total_size") for s in snap.segments)
    allocated = sum(b.size for b in snap.blocks if b.state != "inactive")
    free = [b.size for b in snap.blocks if b.state == "inactive"]
    return {"device": snap.device, "segments": len(snap.segments), "reserved": reserved, "allocated": allocated,
            "requested": sum(b.requested or b.size for b in snap.blocks if b.state != "inactive"),
            "cached_free": sum(free), "largest_free": max(free, default=0),
            "fragmentation": (sum(free) / reserved) if reserved else 0.0, "blocks": len(snap.blocks)}


FRAME_RULES = (        # an allocated block's frames -> what it is, first rule that any frame meets
    ("optimizer_states", r"_init_group|optim/adamw?\.py|fused_adam|cpu_adam|_multi_tensor_adam|_single_tensor_adam|"
                         r"optimizer\.py.*step|zero_grad"),
    ("gradients", r"AccumulateGrad|reduce_ipg|_post_backward|reduce_scatter|grad_acc"),
    ("backward", r"backward|run_backward|_engine_run_backward"),
    ("parameters", r"from_pretrained|_load_state_dict|load_state_dict|_apply|\bconvert\b|set_module_tensor_to_device|"
                   r"_init_flat_param|partition_parameters"),
    ("logits", r"lm_head|cross_entropy|log_softmax|ForCausalLMLoss|logits"),
    ("activations", r"forward|_call_impl"),
)


def named(snap: Snapshot, candidates=(), trace_categories: bool = True) -> list[dict]:
    """Each allocated block (largest first): {'size', 'requested', 'name', 'how'}: 'how' is 'allocator model' (this
    package's writer named it), 'profiler' (torch's profiler category of its allocation), 'frames' (the rule its
    frames met, with the frame) or 'size' (the candidate buffers of that size), else 'unnamed'."""
    from helpers.measure.allocator import round_size

    by_addr = {}
    if trace_categories:
        for e in snap.trace:
            if e.get("action") == "alloc" and e.get("category"):
                by_addr[e.get("addr")] = e["category"]
    out = []
    for b in snap.blocks:
        addr = b.address
        if b.state == "inactive":
            continue
        req = b.requested if b.requested is not None else b.size
        row = {"size": b.size, "requested": req, "name": None, "how": "unnamed", "frame": None}
        own = next((f for f in b.frames if f["filename"] == OWN_FRAME), None)
        if own:
            row.update(name=own["name"], how="allocator model")
        elif addr in by_addr:
            row.update(name=by_addr[addr], how="profiler")
        else:
            hit = _by_frames(b.frames)
            if hit:
                row.update(name=hit[0], how="frames", frame=hit[1])
            else:
                same = [c for c in candidates if round_size(c.bytes) == round_size(req)]
                if same:
                    row.update(name=" | ".join(dict.fromkeys(c.name for c in same[:3])), how="size")
        out.append(row)
    out.sort(key=lambda r: -r["size"])
    return out


def _by_frames(frames: list[dict]):
    for name, pattern in FRAME_RULES:
        rx = re.compile(pattern)
        for f in frames:
            where = f"{f['filename']}:{f['name']}"
            if rx.search(where):
                return name, f"{f['filename'].rsplit('/', 1)[-1]}:{f['line']} {f['name']}"
    return None


def by_name(rows: list[dict]) -> list[tuple[str, int, int]]:
    """(name, blocks, bytes) per name, largest first."""
    acc: dict[str, list[int]] = {}
    for r in rows:
        key = r["name"] or "unnamed"
        acc.setdefault(key, [0, 0])
        acc[key][0] += 1
        acc[key][1] += r["size"]
    return sorted(((k, v[0], v[1]) for k, v in acc.items()), key=lambda x: -x[2])
