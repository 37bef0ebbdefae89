"""The one result format for estimates and measurements: devices x phases x categories, with the OOM verdict.

`Result.to_dict()` is the `--json` object: model, params, mode, setup, then for 'gpu' (per GPU) and 'host' (per node)
peak_bytes, peak_phase, phases {phase: peak bytes in that phase}, categories {category: bytes at the peak},
breakdown {phase: {category: bytes}}, capacity_bytes; and oom {device, phase}. Where the allocator was modelled (a dry
run) or read (a GPU run), 'gpu' also has reserved {phase: bytes the caching allocator holds}, overhead {cuda_context,
nccl_buffers: bytes} and device_total {phase: reserved + overhead, what nvidia-smi would show}; elsewhere they are
null, and the keys above keep their meaning (live tensor bytes). Saved files are written atomically.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from helpers.files import unusable_name, write_text_atomically
from helpers.training import TrainSetup
from helpers.vocab import CATEGORIES, DEVICES, PHASES


@dataclass
class DeviceMemory:
    """Memory of one device kind: bytes per phase and per category."""

    breakdown: dict[str, dict[str, int]]      # {phase: {category: bytes}} at each phase's highest moment
    capacity_bytes: int | None = None
    reserved: dict[str, int] | None = None    # {phase: bytes reserved by the caching allocator} (GPU only)
    overhead: dict[str, int] | None = None    # {part: bytes} held beyond the allocator: CUDA context, NCCL buffers

    @property
    def device_total(self) -> dict[str, int] | None:
        """{phase: reserved + overhead}: what nvidia-smi would show for this process; None without a reserved view."""
        if self.reserved is None:
            return None
        extra = sum((self.overhead or {}).values())
        return {p: v + extra for p, v in self.reserved.items()}

    @property
    def phases(self) -> dict[str, int]:
        return {p: sum(c.values()) for p, c in self.breakdown.items()}

    @property
    def peak_phase(self) -> str | None:
        """The phase of the highest bytes (the earliest of equals); None when no phase was recorded."""
        phases = self.phases
        if not phases:
            return None
        return max(phases, key=lambda p: (phases[p], -PHASES.index(p)))

    @property
    def peak_bytes(self) -> int:
        return self.phases[self.peak_phase] if self.breakdown else 0

    @property
    def categories(self) -> dict[str, int]:
        return dict(self.breakdown[self.peak_phase]) if self.breakdown else {}

    def first_over(self) -> str | None:
        """The first phase whose bytes exceed the capacity, or None."""
        if self.capacity_bytes is None:
            return None
        return next((p for p, v in self.phases.items() if v > self.capacity_bytes), None)

    def to_dict(self) -> dict:
        return {
            "peak_bytes": self.peak_bytes, "peak_phase": self.peak_phase, "phases": self.phases,
            "categories": self.categories, "breakdown": self.breakdown, "capacity_bytes": self.capacity_bytes,
            "reserved": self.reserved, "overhead": self.overhead, "device_total": self.device_total,
        }


@dataclass
class Result:
    """Memory of one set-up: per GPU and per node host, by phase and category; `mode` says how it was obtained."""

    model: str
    params: int
    mode: str
    setup: dict
    gpu: DeviceMemory
    host: DeviceMemory
    items: list[dict] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    @property
    def train_setup(self) -> TrainSetup:
        """The set-up as a TrainSetup (`setup` is its dict, as the JSON holds it): the degrees, the strategy object and
        every option's resolved value come from it, never re-derived from the dict. Keys a saved file has that this
        version's TrainSetup lacks are left out."""
        known = {f.name for f in dataclasses.fields(TrainSetup)}
        return TrainSetup(**{k: v for k, v in self.setup.items() if k in known})

    def item_bytes(self, name_starts: str, device: str = "gpu") -> int:
        """The bytes of the items on `device` whose names start with `name_starts` (an item named by the estimate,
        e.g. "fp32 logits of every position"); 0 where none is."""
        return sum(i["bytes"] for i in self.items if i["device"] == device and i["name"].startswith(name_starts))

    def device(self, name: str) -> DeviceMemory:
        if name not in DEVICES:
            from helpers.errors import InputError

            raise InputError(f"device must be one of {', '.join(DEVICES)}, got {name!r}")
        return getattr(self, name)

    def per_param(self, device: str = "gpu", phase: str | None = None) -> dict[str, float]:
        """Bytes per parameter of each category on `device` at `phase` (default: the device's peak phase)."""
        d = self.device(device)
        if not d.breakdown:
            return {}
        return {c: v / self.params for c, v in d.breakdown[phase or d.peak_phase].items() if v}

    @property
    def oom(self) -> dict:
        """{'device': 'gpu'|'host'|None, 'phase': phase|None}: an out-of-memory a GPU run observed (meta
        'oom_observed'), else the first phase in which a device's bytes exceed its capacity."""
        observed = self.meta.get("oom_observed")
        if observed:
            return {"device": observed.get("device", "gpu"), "phase": observed.get("phase")}
        for phase in self.gpu.phases:
            for dev in DEVICES:
                if self.device(dev).first_over() == phase:
                    return {"device": dev, "phase": phase}
        return {"device": None, "phase": None}

    def to_dict(self) -> dict:
        return {
            "model": self.model, "params": self.params, "mode": self.mode, "setup": self.setup,
            "gpu": self.gpu.to_dict(), "host": self.host.to_dict(), "oom": self.oom,
            "items": self.items, "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Result":
        dev = {k: DeviceMemory(d[k]["breakdown"], d[k].get("capacity_bytes"), d[k].get("reserved"), d[k].get("overhead"))
               for k in DEVICES}
        return cls(d["model"], d["params"], d["mode"], d["setup"], dev["gpu"], dev["host"],
                   d.get("items", []), d.get("meta", {}))

    def save(self, path: str | Path, extra: dict | None = None) -> Path:
        """Write the JSON atomically (temporary file, then rename); `extra`: more keys beside the result's own (the
        CLI adds `evidence`, as its --json prints it)."""
        return write_text_atomically(check_save_path(path), json.dumps(self.to_dict() | (extra or {}), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> "Result":
        return cls.from_dict(json.loads(Path(path).read_text()))


def empty_breakdown(phases) -> dict[str, dict[str, int]]:
    return {p: {c: 0 for c in CATEGORIES} for p in phases}


def check_save_path(path) -> Path:
    """`path` as a Path if a result can be written there; InputError naming it and why not. Checked before a
    measurement starts (so a bad --save does not cost the run): a non-empty path, not a folder, whose nearest existing
    parent is a folder this process can write into (missing folders below it are created by `save`)."""
    from helpers.errors import InputError

    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise InputError(f"save path must be a file path such as data/results/NAME.json, got {path!r}")
    path = Path(path).expanduser()
    why = unusable_name(path)
    if why:
        raise InputError(f"save path must be a usable file name, got {str(path)[:80]!r}... ({why}"
                         + (", which the system refuses)" if "255" in why else ")"))
    if path.is_dir() or str(path).endswith(os.sep):
        raise InputError(f"save path must be a file, not a folder, got {str(path)!r}")
    if (path.exists() or path.is_symlink()) and not path.is_file():      # a FIFO, a device, a dangling link:
        raise InputError(f"save path must be a regular file (or a new one), got {str(path)!r}, which is not: "
                         f"a result never replaces a device, a pipe or a link to nothing")
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(f"save path must be under a folder, got {str(path)!r} ({str(parent)!r} is a file)")
    try:                                  # the one sure test: make (and remove) a file there
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".oom-casebook-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise InputError(f"save path must be in a folder this process can write to, got {str(path)!r} "
                         f"(cannot write in {str(parent)!r}: {exc.strerror or exc})") from None
    return path
