"""A memory tracker: live tensor bytes by category, phase and device, with each phase's peak.

Every op's outputs are seen through a TorchDispatchMode; each new storage becomes a record, and a weak reference
tells when it is freed. An event log (allocations, frees, phase changes) is replayed at the end to find each
(phase, device) peak, so categories and placements can be settled late: a tensor made in backward that turned out
to be a gradient, or one the optimizer kept as its state, is counted as such at every peak it was part of; and in a
scaled CPU run, a buffer the engine would keep on the host is placed there by `label(..., device='host')`.
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

from helpers.vocab import CATEGORIES, check

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

    def __init__(self, default_device: str | None = None):
        """`default_device` ('gpu' or 'host') places every tensor there unless labelled otherwise; None places a
        tensor by its own device (a CPU tensor on the host, any other on the GPU)."""
        super().__init__()
        self.default_device = default_device
        self._records: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.events: list[tuple] = []
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
        self.events.append(("phase", name))
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
            self.events.append(("phase", "_between"))      # between phases nothing is counted
            self._phase, self._activity = "_between", previous[1]

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

    @contextlib.contextmanager
    def placing(self, device: str):
        """Place tensors made inside on `device` (e.g. an optimizer step that runs on the host)."""
        previous, self.default_device = self.default_device, device
        try:
            yield
        finally:
            self.default_device = previous

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
        self.events.append(("restart", phase))

    def label(self, tensors, category: str, device: str | None = None) -> None:
        """Settle the category (and, if given, the placement) of these tensors' storages, registering them if new."""
        check("category", category, CATEGORIES)
        for t in tensors:
            if isinstance(t, torch.Tensor):
                rec = self.track(t)
                rec.category = category
                if device is not None:
                    rec.device = device

    # -- bookkeeping ---------------------------------------------------------------------------------------------
    def track(self, t: torch.Tensor) -> Record:
        """The record of this tensor's storage, made (and counted) if new."""
        t = _local(t)
        st = t.untyped_storage()
        rec = self._records.get(st)
        if rec is None:
            rec = Record(st.nbytes(), self.default_device or device_kind(t), self._activity, self._context,
                         self._made_as)
            rec.ref = weakref.ref(st, lambda _r, rec=rec: self._free(rec))
            self._records[st] = rec
            self._add(rec, rec.nbytes)
        elif st.nbytes() != rec.nbytes:
            self._resized(rec, st.nbytes())
        return rec

    def _add(self, rec: Record, nbytes: int) -> None:
        self.events.append((rec, nbytes))

    def _resized(self, rec: Record, nbytes: int) -> None:
        delta, rec.nbytes = nbytes - rec.nbytes, nbytes
        self._add(rec, delta)

    def _free(self, rec: Record) -> None:
        if rec.nbytes:
            self.events.append((rec, -rec.nbytes))
            rec.nbytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self._paused:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.device.type != "meta":    # meta tensors hold no memory
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
        live = {c: 0 for c in CATEGORIES}
        total, phase = 0, "setup"
        best: dict[str, tuple[int, dict]] = {"setup": (0, dict(live))}
        for event in self.events:
            if event[0] in ("phase", "restart"):
                phase = event[1]
                if event[0] == "restart" or phase not in best:
                    best[phase] = (total, dict(live))
                continue
            rec, delta = event
            if rec.device != device:
                continue
            live[self.category(rec)] += delta
            total += delta
            if total > best[phase][0]:
                best[phase] = (total, dict(live))
        return {p: {c: v * scale for c, v in best[p][1].items()} for p in self.phases if p in best}
