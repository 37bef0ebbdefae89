"""Units: every byte count in the package is an int of bytes; these convert for display.

GiB is 2**30 bytes (what nvidia-smi, PyTorch and DeepSpeed print); GB is 10**9 bytes (what spec sheets print).
"""

GiB = 2**30
GB = 10**9
MiB = 2**20


def to_gib(nbytes: float) -> float:
    """Bytes -> GiB (2**30 bytes)."""
    return nbytes / GiB


def to_gb(nbytes: float) -> float:
    """Bytes -> GB (10**9 bytes)."""
    return nbytes / GB


def from_gib(gib: float) -> int:
    """GiB (2**30 bytes) -> bytes."""
    return int(round(gib * GiB))


UNITS = {"B": 1, "bytes": 1, "KiB": 2**10, "MiB": MiB, "GiB": GiB, "TiB": 2**40, "PiB": 2**50, "GB": GB}
"""Byte units by the names torch, DeepSpeed and spec sheets print them."""


def scale(values_bytes) -> tuple[str, int]:
    """('GiB', 2**30), or ('MiB', 2**20) when every value is under 1 GiB (a twin's figures would read 0.0 in GiB)."""
    return ("GiB", GiB) if max(values_bytes, default=0) >= GiB else ("MiB", MiB)


def fmt(nbytes: float, digits: int = 1) -> str:
    """Bytes as '61.2 GiB', or '11.4 MiB' under 1 GiB: the one way figures are written in text."""
    unit, div = scale([nbytes])
    return f"{nbytes / div:.{digits}f} {unit}"


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (n >= 1); the rounding of PyTorch's pinned host caching allocator."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()
