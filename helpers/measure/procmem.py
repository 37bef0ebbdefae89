"""This process's memory as Linux reports it: resident figures from /proc/self/status, the peak reset, the heap
trimmed. Used where a measurement must see everything a process holds (scratch inside an op, a loaded file)."""

from __future__ import annotations

import contextlib
import gc
import threading
import time


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


@contextlib.contextmanager
def growth():
    """Measure what the block adds: yields a dict filled on exit with 'peak' (VmHWM growth over the resident size at
    entry, reset there), 'anon' (the peak of anonymous resident memory, RssAnon, sampled every millisecond, over its
    value at entry: private pages, not the page cache), 'anon_after' (RssAnon on exit over its value at entry: what the
    block left held) and 'seconds'. The heap is trimmed first, so growth is new
    memory rather than reused free lists."""
    gc.collect()
    trim_heap()
    before, anon_before = reset_peak(), status_bytes("RssAnon")
    peak, stop, out = [anon_before], threading.Event(), {}

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], status_bytes("RssAnon"))
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    try:
        yield out
    finally:
        out["seconds"] = time.perf_counter() - started
        stop.set()
        sampler.join()
        out.update(before=before, peak=status_bytes("VmHWM") - before,
                   anon=max(peak[0], status_bytes("RssAnon")) - anon_before,
                   anon_after=status_bytes("RssAnon") - anon_before)
