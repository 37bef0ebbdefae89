"""A memory tracker: live tensor bytes by category, phase and device, with each phase's peak.

Every op's outputs are seen through a TorchDispatchMode; each new storage becomes a record, and a weak reference
tells when it is freed. An event log (allocations and frees) keeps the peak of each (phase, device) as an index, so
categories can be settled at the end: a tensor made in backward that turned out to be a gradient, or one made in
the step that the optimizer kept as its state, is counted as such at every peak it was part of.
Only the ops' outputs are looked at, never the module tree, so a step costs little more than the step itself.

Known limitations:
- Scratch memory inside a single op (e.g. a kernel's workspace, logsumexp's buffer) is not seen.
- It counts tensor bytes, not the allocator's: caching, block rounding (512 B on CUDA) and fragmentation are not in it.
- Storages resized in place (FSDP2's all-gather buffers) are followed through `UntypedStorage.resize_`; other
  in-place storage tricks are not.
- A tensor is placed on 'gpu' or 'host' by its device: fake 'gpu' (and 'cuda') is the GPU, 'cpu' the host.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from helpers.vocab import CATEGORIES

_DEFAULTS = {"setup": "parameters", "forward": "activations", "backward": "temporaries", "step": "temporaries"}


@dataclass(eq=False)
class Record:
    """One storage: its bytes, device, and when and where it was made."""

    nbytes: int
    device: str
    activity: str
    context: str | None
    category: str | None = None
    ref: object = None


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def device_kind(t: torch.Tensor) -> str:
    """'host' for CPU tensors, 'gpu' for every other device."""
    return "host" if t.device.type == "cpu" else "gpu"


class Tracker(TorchDispatchMode):
    """Track live tensor bytes; use `phase()`, `activity()`, `context()` and `label()` to attribute them."""

    def __init__(self):
        super().__init__()
        self._records: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.events: list[tuple[Record, int]] = []
        self.totals = {"gpu": 0, "host": 0}
        self.peaks: dict[tuple[str, str], tuple[int, int]] = {}
        self.phases: list[str] = []
        self._phase = "setup"
        self._activity = "setup"
        self._context: str | None = None
        self._resize_orig = None
        self._paused = 0
        self._made_as: str | None = None
        self._open_phase("setup")

    # -- attribution ---------------------------------------------------------------------------------------------
    def _open_phase(self, name: str) -> None:
        if name not in self.phases:
            self.phases.append(name)
        for dev in self.totals:
            self.peaks.setdefault((name, dev), (self.totals[dev], len(self.events)))
        self._phase = name

    @contextlib.contextmanager
    def phase(self, name: str, activity: str | None = None):
        """Count the peak of `name` while inside; `activity` says what new tensors default to."""
        previous = self._phase, self._activity
        self._open_phase(name)
        self._activity = activity or name
        try:
            yield
        finally:
            self._phase, self._activity = previous

    @contextlib.contextmanager
    def activity(self, name: str):
        previous, self._activity = self._activity, name
        try:
            yield
        finally:
            self._activity = previous

    @contextlib.contextmanager
    def paused(self):
        """Ignore ops inside (e.g. DTensor's shape propagation on scratch fake tensors)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def set_context(self, name: str | None) -> None:
        """Tag new tensors (e.g. 'logits') until set back to None."""
        self._context = name

    @contextlib.contextmanager
    def made_as(self, category: str):
        """Count every tensor made inside as `category` (e.g. an engine's communication code)."""
        previous, self._made_as = self._made_as, category
        try:
            yield
        finally:
            self._made_as = previous

    def restart_peak(self, phase: str) -> None:
        """Let `phase`'s peak be what is live now (e.g. setup measured after initialisation's transients)."""
        for dev in self.totals:
            self.peaks[(phase, dev)] = (self.totals[dev], len(self.events))

    def label(self, tensors, category: str) -> None:
        """Settle the category of these tensors' storages (registering them if new)."""
        if category not in CATEGORIES:
            raise ValueError(f"unknown category {category!r}")
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self.track(t).category = category

    # -- bookkeeping ---------------------------------------------------------------------------------------------
    def track(self, t: torch.Tensor) -> Record:
        """The record of this tensor's storage, made (and counted) if new."""
        t = _local(t)
        st = t.untyped_storage()
        rec = self._records.get(st)
        if rec is None:
            rec = Record(st.nbytes(), device_kind(t), self._activity, self._context, self._made_as)
            rec.ref = weakref.ref(st, lambda _r, rec=rec: self._free(rec))
            self._records[st] = rec
            self._add(rec, rec.nbytes)
        elif st.nbytes() != rec.nbytes:
            self._resized(rec, st.nbytes())
        return rec

    def _add(self, rec: Record, nbytes: int) -> None:
        self.totals[rec.device] += nbytes
        self.events.append((rec, nbytes))
        key = (self._phase, rec.device)
        if self.totals[rec.device] > self.peaks[key][0]:
            self.peaks[key] = (self.totals[rec.device], len(self.events))

    def _resized(self, rec: Record, nbytes: int) -> None:
        delta, rec.nbytes = nbytes - rec.nbytes, nbytes
        self._add(rec, delta)

    def _free(self, rec: Record) -> None:
        if rec.nbytes:
            self.totals[rec.device] -= rec.nbytes
            self.events.append((rec, -rec.nbytes))
            rec.nbytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self._paused:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.track(t)
        return out

    def __enter__(self):
        tracker = self
        self._resize_orig = orig = torch.UntypedStorage.resize_

        def resize_(storage, size):
            result = orig(storage, size)
            rec = tracker._records.get(storage)
            if rec is not None and storage.nbytes() != rec.nbytes:
                tracker._resized(rec, storage.nbytes())
            return result

        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._resize_orig
        return super().__exit__(*exc)

    # -- results -------------------------------------------------------------------------------------------------
    def category(self, rec: Record) -> str:
        if rec.category:
            return rec.category
        if rec.context == "logits":
            return "logits"
        return _DEFAULTS.get(rec.activity, "temporaries")

    def breakdown(self, device: str, scale: int = 1) -> dict[str, dict[str, int]]:
        """{phase: {category: bytes}} at each phase's peak on `device`, times `scale` (ranks per node)."""
        targets = {}
        for phase in self.phases:
            targets.setdefault(self.peaks[(phase, device)][1], []).append(phase)
        out = {p: {c: 0 for c in CATEGORIES} for p in self.phases}
        live: dict[int, int] = {}
        recs: dict[int, Record] = {}

        def snapshot(index):
            for phase in targets.get(index, []):
                for key, nbytes in live.items():
                    out[phase][self.category(recs[key])] += nbytes * scale

        snapshot(0)
        for i, (rec, delta) in enumerate(self.events, start=1):
            if rec.device == device:
                live[id(rec)] = live.get(id(rec), 0) + delta
                recs[id(rec)] = rec
                if live[id(rec)] == 0:
                    del live[id(rec)]
            snapshot(i)
        return out
