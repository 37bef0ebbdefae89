"""What `nvidia-smi` would show: GPU presets (capacity as the hardware reports it), the CUDA context, cuBLAS's
workspaces and NCCL's buffers.

The device total of one GPU is the allocator's reserved bytes (`helpers.measure.allocator`) + cuBLAS's workspaces
(in the allocator, but no tensor) + the CUDA context + NCCL's buffers where the strategy communicates. Capacities and
NCCL's default come from `data/published.json` with their sources, the context from this project's own GPU runs
(`data/results/gpu_runs.json`) where they exist, the workspaces from PyTorch's source; what no source gave is said
to be assumed, here and in the output."""

from __future__ import annotations

import functools

from helpers import published, strategies
from helpers.errors import InputError
from helpers.units import GiB, MiB

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
    "l20": "NVIDIA L20",
    "rtx-6000-ada": "NVIDIA RTX 6000 Ada Generation",
}
NCCL_CHANNELS_ASSUMED = 16      # channels NCCL opens: topology-dependent, no documented default (assumed)
NCCL_PEERS_RING = 2             # a ring's two neighbours per channel (assumed: the ring algorithm, Simple protocol)


OTHER_CARD = frozenset({"laptop", "mobile", "notebook", "ti", "super", "max", "q"})
"""Words in a GPU's name that make it another card than the preset its other words name (memory differs)."""


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
    families = {p.split("-")[0] for p in PRESETS} & tokens
    if re.search(r"[,;/|+&]", key) or len(families) > 1:
        raise InputError(f"gpu names one GPU (the card each rank runs on), got {name[:60]!r}, which names more than "
                         f"one; presets: {', '.join(sorted(PRESETS))}")
    fits = [p for p in PRESETS if p.split("-")[0] == key or p.removeprefix("rtx-") == key
            or p.replace("-", "") == key.replace("-", "")]
    if not fits:               # every part of a preset's name among the name's (A100-SXM4-80GB, V100-SXM2-32GB)
        fits = [p for p in PRESETS if len(p.split("-")) > 1 and set(p.split("-")) <= tokens]
    other_card = tokens & OTHER_CARD                      # a laptop 4090 (16 GB) is not a desktop one (24 GB)
    fits = [p for p in fits if not other_card - set(p.split("-"))]
    if len(fits) == 1:
        return fits[0]
    near = [] if other_card else difflib.get_close_matches(key, list(PRESETS), n=3, cutoff=0.5)
    shown = repr(name) if len(name) <= 60 else repr(name[:60]) + "..."
    what = (f"{shown} could be {' or '.join(fits)}" if fits else
            f"got {shown}" + (f" (did you mean {' or '.join(near)}?)" if near else "")
            + (f" ({'/'.join(sorted(other_card))}: a different card from every preset)" if other_card else ""))
    raise InputError(f"gpu must be one of {', '.join(sorted(PRESETS))} (capacities as CUDA gives them, each "
                     f"with a source in data/published.json): {what}; --gpu-gib X takes any capacity")


def preset(name: str) -> dict:
    """A GPU preset: {'name', 'gpu', 'mib' (nvidia-smi's total), 'bytes' and 'gib' (the capacity a verdict uses),
    'cuda_total' (its sources), 'source', 'url', 'note'}; InputError for an unknown one.

    The capacity is what CUDA gives a process: torch.cuda.get_device_properties().total_memory, the 'total capacity'
    PyTorch's out-of-memory message prints, 0.3 to 0.9 GiB below nvidia-smi's total (the driver keeps the rest). The
    smallest figure quoted from public out-of-memory reports for that GPU (data/published.json), less half its last
    printed digit; nvidia-smi's total where no report was found."""
    name = canonical(name)
    row = published.gpu_capacity(PRESETS[name])
    seen = row.get("cuda_total_gib") or []
    gib = round(min(x["gib"] for x in seen) - 0.005, 3) if seen else row["mib"] / 1024
    return row | {"name": name, "bytes": round(gib * GiB), "gib": gib, "cuda_total": seen}


GPU_RUNS = "gpu_runs.json"       # data/results/: `python -m helpers.bench gpu`, full-size steps on a real GPU (H100)


def runs_file(device: str) -> str:
    """The file in data/results/ that `python -m helpers.bench gpu` writes on the GPU nvidia-smi calls `device`:
    gpu_runs.json for the H100 (the first recorded), else gpu_runs_<preset>.json (the name in lower case, its
    non-alphanumerics as '-', for a GPU without a preset)."""
    import re

    if device == PRESETS["h100-80gb"]:
        return GPU_RUNS
    name = preset_of(device) or re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    return f"gpu_runs_{name}.json"


def preset_of(device: str) -> str | None:
    """The preset whose GPU nvidia-smi calls `device` exactly (None for a GPU without one)."""
    return {v: k for k, v in PRESETS.items()}.get(device)


def run_files() -> list:
    """The recorded GPU runs in data/results/ (gpu_runs.json and every gpu_runs_<preset>.json), by name."""
    return sorted((published.DATA_DIR / "results").glob("gpu_runs*.json"))


@functools.lru_cache(maxsize=1)
def measured_contexts() -> dict[str, dict]:
    """The bytes outside PyTorch's allocator that a training process held, per GPU this project ran on (nvidia-smi's
    name -> {'mib', 'source', 'url', 'note', 'applies_to', 'gpu'}): torch.cuda.mem_get_info's used bytes less
    memory_reserved at each phase's end, the largest over every recorded run and phase of that GPU's file
    (data/results/gpu_runs*.json)."""
    import json

    out = {}
    for path in run_files():
        doc = json.loads(path.read_text())
        seen = [v["outside_allocator"] for r in doc["rows"] if r["result"]
                for v in r["result"]["meta"]["cuda_stats"].values() if "outside_allocator" in v]
        if not seen:
            continue
        v = doc["versions"]
        out[doc["device"]] = {
            "gpu": doc["device"], "mib": max(seen) / MiB,
            "applies_to": f"{doc['device']}, torch {v['torch']} (CUDA {v['cuda']}, driver {v['driver']}), after a "
                          f"training step (forward, backward, AdamW)",
            "source": f"measured by this project: python -m helpers.bench gpu on {doc['date'][:10]}, "
                      f"{len(doc['rows'])} set-ups, torch.cuda.mem_get_info used bytes less memory_reserved, the "
                      f"largest at any phase's end",
            "url": f"data/results/{path.name}",
            "note": "the driver's state and every kernel a training step loads (cuBLAS, attention, optimizer): more "
                    "than a bare context"}
    return out


def cuda_context(gpu: str | None = None) -> dict:
    """The CUDA context of one training process on `gpu` (a preset name or nvidia-smi's name; None: any): {'bytes',
    'source', 'url', 'note', 'applies_to'}. A measurement after a training step on that GPU where this project made
    one; else the largest of the generic published figure and the after-step measurements on other GPUs, said so (a
    bare context, before any kernel ran, is smaller than a training process's: it is listed, never used)."""
    rows = published.cuda_context_rows()
    if gpu is not None and gpu not in PRESETS and gpu not in PRESETS.values():
        gpu = canonical(gpu)
    name = PRESETS.get(gpu, gpu)
    measured = measured_contexts()
    if name in measured:
        row = measured[name]
    else:
        row = max([rows[0], *measured.values()], key=lambda r: r["mib"])
        if row is not rows[0]:
            row = row | {"note": f"measured on {row['gpu']}; assumed for "
                                 f"{name or 'a GPU not named'} (not measured there)"}
    return row | {"bytes": round(row["mib"] * MiB)}


HOPPER = ("h100-80gb", "h100-nvl", "h200", "h20")     # compute capability 9.0
CUBLAS_SOURCE = ("pytorch/pytorch aten/src/ATen/cuda/CublasHandlePool.cpp: parseChosenWorkspaceSize (CUBLAS_WORKSPACE_"
                 "CONFIG's default, :4096:8 on sm90, else :4096:2:16:8) and getCurrentCUDABlasHandle (a workspace per "
                 "handle and stream, handles per thread, allocated through the caching allocator)")
CUBLAS_THREADS = 2       # the forward's matmuls on the Python thread, backward's on autograd's device thread


def cublas_workspaces(gpu: str | None = None) -> dict:
    """The cuBLAS workspaces a training process holds on one GPU: one per thread that runs matmuls (2), each 32 MiB
    on Hopper (sm90) and 8 MiB + 128 KiB elsewhere; a GPU not named is taken as Hopper (the larger). They are
    allocated through PyTorch's caching allocator, but as no tensor: the tracker never sees them.
    {'bytes', 'detail', 'source'}. Measured on an H100 (torch 2.11): 32 MiB after the forward, 64 MiB after backward."""
    name = canonical(gpu) if gpu is not None and gpu not in PRESETS else gpu
    each = 4096 * 8 * 1024 if name is None or name in HOPPER else 4096 * 1024 * 2 + 16 * 1024 * 8
    return {"bytes": CUBLAS_THREADS * each, "source": CUBLAS_SOURCE,
            "detail": f"{CUBLAS_THREADS} threads (forward, autograd's backward) x {each / MiB:g} MiB"
                      + (" (Hopper)" if name in HOPPER else " (Hopper's, the larger: no GPU named)" if name is None
                         else "")}


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
    """The bytes a GPU holds beyond the tensors' reserve: {'cuda_context', 'cublas_workspaces', 'nccl_buffers'}."""
    return {"cuda_context": cuda_context(gpu)["bytes"], "cublas_workspaces": cublas_workspaces(gpu)["bytes"],
            "nccl_buffers": nccl_buffers(strategy, gpus)["bytes"]}


def pushed_over(allocated: int, reserved: int, parts: dict[str, int], capacity: int) -> str | None:
    """Which part takes a GPU past `capacity`, adding them in order: allocated, then the context and NCCL's buffers,
    then fragmentation (reserved - allocated); None if the total fits."""
    total = allocated
    if total > capacity:
        return "allocated"
    for name in ("cuda_context", "cublas_workspaces", "nccl_buffers"):
        total += parts.get(name, 0)
        if total > capacity:
            return name
    return "fragmentation" if total + (reserved - allocated) > capacity else None


PART_LABELS = {"allocated": "the tensors alone (allocated)", "cuda_context": "the CUDA context",
               "cublas_workspaces": "cuBLAS's workspaces",
               "nccl_buffers": "NCCL's buffers", "fragmentation": "the allocator's cached and split blocks (fragmentation)"}
