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


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (n >= 1); the rounding of PyTorch's pinned host caching allocator."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()
