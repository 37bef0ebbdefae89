"""Where a measurement came from: the library versions every result records beside its device and date."""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version


def versions() -> dict:
    """torch, transformers and deepspeed as installed (a missing one is left out), and Python's version."""
    out = {}
    for name in ("torch", "transformers", "deepspeed"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:       # pragma: no cover - all three are dependencies
            pass
    return out | {"python": platform.python_version()}
