"""What `nvidia-smi` would show: GPU presets (capacity as the hardware reports it), the CUDA context and NCCL's buffers.

The device total of one GPU is the allocator's reserved bytes (`helpers.measure.allocator`) + the CUDA context +
NCCL's buffers where the strategy communicates. Every figure comes from `data/published.json` with its source; what
no source gave is said to be assumed, here and in the output.
"""

from __future__ import annotations

from helpers import published, strategies
from helpers.errors import InputError
from helpers.units import MiB

PRESETS = {                     # --gpu NAME -> the name nvidia-smi prints (its capacity row in data/published.json)
    "a100-80gb": "NVIDIA A100 80GB",
    "a100-40gb": "NVIDIA A100 40GB",
    "h100-80gb": "NVIDIA H100 80GB HBM3",
    "l40s": "NVIDIA L40S",
    "a10": "NVIDIA A10",
    "l4": "NVIDIA L4",
    "t4": "Tesla T4",
    "rtx-4090": "NVIDIA GeForce RTX 4090",
    "rtx-3090": "NVIDIA GeForce RTX 3090",
    "h200": "NVIDIA H200",
    "h100-nvl": "NVIDIA H100 NVL",
    "a800-80gb": "NVIDIA A800-SXM4-80GB",
    "h20": "NVIDIA H20",
    "rtx-a6000": "NVIDIA RTX A6000",
    "a10g": "NVIDIA A10G",
    "v100-32gb": "Tesla V100-SXM2-32GB",
    "v100-16gb": "Tesla V100-SXM2-16GB",
    "rtx-3060": "NVIDIA GeForce RTX 3060",
}
NCCL_CHANNELS_ASSUMED = 16      # channels NCCL opens: topology-dependent, no documented default (assumed)
NCCL_PEERS_RING = 2             # a ring's two neighbours per channel (assumed: the ring algorithm, Simple protocol)


def canonical(name: str) -> str:
    """The preset `name` means, read as people write GPU names: any case, spaces or underscores for dashes, with or
    without NVIDIA / GeForce / Tesla, and short where only one preset fits ('H100', 'RTX 4090', '4090', 'a10g' is
    not 'a10'); InputError naming the presets otherwise (an ambiguous 'a100' names both)."""
    if not isinstance(name, str):
        raise InputError(f"gpu must be a preset name ({', '.join(sorted(PRESETS))}), got {name!r}")
    import difflib
    import re

    key = "-".join(name.strip().lower().replace("_", " ").replace("-", " ").split())
    for prefix in ("nvidia-", "geforce-", "tesla-"):
        key = key.removeprefix(prefix)
    key = re.sub(r"\b(\d+)g\b", r"\1gb", key)                       # 80g -> 80gb
    if key in PRESETS:
        return key
    by_smi = {v.lower().replace(" ", "-"): k for k, v in PRESETS.items()}
    for smi, preset_name in by_smi.items():                            # nvidia-smi's own name
        if key in (smi, smi.removeprefix("nvidia-").removeprefix("tesla-")):
            return preset_name
    tokens = set(key.split("-"))
    fits = [p for p in PRESETS if p.split("-")[0] == key or p.removeprefix("rtx-") == key
            or p.replace("-", "") == key.replace("-", "")]
    if not fits:               # every part of a preset's name among the name's (A100-SXM4-80GB, V100-SXM2-32GB)
        fits = [p for p in PRESETS if len(p.split("-")) > 1 and set(p.split("-")) <= tokens]
    if len(fits) == 1:
        return fits[0]
    near = difflib.get_close_matches(key, list(PRESETS), n=3, cutoff=0.5)
    what = (f"{name!r} could be {' or '.join(fits)}" if fits else
            f"got {name!r}" + (f" (did you mean {' or '.join(near)}?)" if near else ""))
    raise InputError(f"gpu must be one of {', '.join(sorted(PRESETS))} (capacities as nvidia-smi prints them, each "
                     f"with a source in data/published.json): {what}; --gpu-gib X takes any capacity")


def preset(name: str) -> dict:
    """A GPU preset: {'name', 'gpu', 'mib', 'bytes', 'gib', 'source', 'url', 'note'}; InputError for an unknown one."""
    name = canonical(name)
    row = published.gpu_capacity(PRESETS[name])
    return row | {"name": name, "gib": row["mib"] / 1024}


def cuda_context(gpu: str | None = None) -> dict:
    """The CUDA context of one process on `gpu` (a preset name or nvidia-smi's name; None: any): {'bytes', 'source',
    'url', 'note', 'applies_to'}: a measurement for that GPU where one was found, else the generic CUDA >= 11.7 one."""
    rows = published.cuda_context_rows()
    if gpu is not None and gpu not in PRESETS and gpu not in PRESETS.values():
        gpu = canonical(gpu)
    name = PRESETS.get(gpu, gpu)
    row = next((r for r in rows if name and r.get("gpu") == name), rows[0])
    return row | {"bytes": row["mib"] * MiB}


def nccl_buffers(strategy: str, gpus: int) -> dict:
    """NCCL's buffers on one GPU: NCCL_BUFFSIZE x channels x ring peers when the strategy communicates (more than one
    GPU), else 0; {'bytes', 'detail', 'source', 'url'}. The channel count is assumed (said so in 'detail')."""
    doc = published.nccl()
    if gpus <= 1 or not strategies.get(strategy).multi_gpu:
        return {"bytes": 0, "detail": "one GPU: no NCCL communicator", "source": doc["source"], "url": doc["url"]}
    n = doc["buffsize_bytes"] * NCCL_CHANNELS_ASSUMED * NCCL_PEERS_RING
    return {"bytes": n, "source": doc["source"], "url": doc["url"],
            "detail": f"NCCL_BUFFSIZE {doc['buffsize_bytes'] // MiB} MiB (documented default) x {NCCL_CHANNELS_ASSUMED} "
                      f"channels (assumed) x {NCCL_PEERS_RING} ring peers (assumed)"}


def overhead(strategy: str, gpus: int, gpu: str | None = None) -> dict[str, int]:
    """The bytes a GPU holds beyond the allocator's reserve: {'cuda_context': ..., 'nccl_buffers': ...}."""
    return {"cuda_context": cuda_context(gpu)["bytes"], "nccl_buffers": nccl_buffers(strategy, gpus)["bytes"]}


def pushed_over(allocated: int, reserved: int, parts: dict[str, int], capacity: int) -> str | None:
    """Which part takes a GPU past `capacity`, adding them in order: allocated, then the context and NCCL's buffers,
    then fragmentation (reserved - allocated); None if the total fits."""
    total = allocated
    if total > capacity:
        return "allocated"
    for name in ("cuda_context", "nccl_buffers"):
        total += parts.get(name, 0)
        if total > capacity:
            return name
    return "fragmentation" if total + (reserved - allocated) > capacity else None


PART_LABELS = {"allocated": "the tensors alone (allocated)", "cuda_context": "the CUDA context",
               "nccl_buffers": "NCCL's buffers", "fragmentation": "the allocator's cached and split blocks (fragmentation)"}
