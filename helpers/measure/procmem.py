"""This process's memory as Linux reports it: resident figures from /proc/self/status, the peak reset, the heap
trimmed. Used where a measurement must see everything a process holds (scratch inside an op, a loaded file)."""

from __future__ import annotations

import contextlib


def status_bytes(field: str) -> int:
    """A memory figure of this process from /proc/self/status ('VmRSS', 'VmHWM', 'RssAnon', ...), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> int:
    """Reset the peak resident size (VmHWM) to the current one; return the current resident bytes."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_bytes("VmRSS")


def trim_heap() -> None:
    """glibc's malloc_trim(0): return freed heap memory to the OS, so a later allocation shows up in RSS rather than
    silently reusing it (a no-op where glibc is absent)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(name).malloc_trim(0)
