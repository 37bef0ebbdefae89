"""Figures others published that a CPU cannot measure (GPU capacities as nvidia-smi prints them, copy bandwidths,
offload and recomputation costs), read from data/published.json with their sources; notebooks quote these."""

from __future__ import annotations

import functools
import json

from helpers.errors import InputError
from helpers.models import DATA_DIR
from helpers.units import GB, GiB, MiB


@functools.lru_cache(maxsize=1)
def _all() -> dict:
    return json.loads((DATA_DIR / "published.json").read_text())


def gpu_capacity(gpu: str) -> dict:
    """One GPU's total memory as nvidia-smi prints it: {'gpu', 'mib', 'bytes', 'source', 'url', 'note'}."""
    rows = {r["gpu"]: r for r in _all()["gpu_capacity_mib"]}
    if gpu not in rows:
        raise InputError(f"no published capacity for {gpu!r}: known GPUs are {', '.join(rows)}")
    return rows[gpu] | {"bytes": rows[gpu]["mib"] * MiB}


def speed(starts_with: str) -> dict:
    """The published speed figure whose description starts with `starts_with`."""
    found = [r for r in _all()["speed"] if r["what"].startswith(starts_with)]
    if len(found) != 1:
        raise InputError(f"{len(found)} published speed figures start with {starts_with!r}")
    return found[0]


def cite(row: dict) -> str:
    """'source (url)' of a published row, and its note when it has one."""
    return f"{row['source']} ({row['url']})" + (f"; {row['note']}" if row.get("note") else "")


def cuda_context_rows() -> list[dict]:
    """Published sizes of the CUDA context (MiB), the generic CUDA >= 11.7 figure first, each with its source."""
    return _all()["cuda_context"]["rows"]


def nccl() -> dict:
    """NCCL's documented default buffer size (NCCL_BUFFSIZE, bytes) with its source."""
    return _all()["nccl"]


def reserved(model: str) -> dict:
    """A published reserved-memory figure (bytes, torch.cuda's reserved view) for `model`, with its set-up and source."""
    found = [r for r in _all()["reserved"] if r["model"] == model]
    if len(found) != 1:
        raise InputError(f"{len(found)} published reserved figures for {model!r}")
    return found[0]


PEAK_UNITS = {"GiB": GiB, "GB": GB, "bytes": 1}   # as published: GiB = 2**30 bytes (torchtitan), GB = 10**9 bytes
                                                  # (LitGPT), bytes (PEFT's result files)
PEAK_VIEWS = ("reserved", "allocated")     # which torch.cuda statistic a published peak is


def peaks() -> list[dict]:
    """Published peak memory of whole training runs (data/published.json 'peaks'), each with 'bytes' added (its
    figure in its published unit, GiB or GB, converted), its set-up in TrainSetup fields, the statistic its tool
    printed ('view': reserved or allocated), its source, and what the run does that the set-up does not express."""
    rows = []
    for row in _all()["peaks"]["rows"]:
        if row["unit"] not in PEAK_UNITS or row["view"] not in PEAK_VIEWS:
            raise InputError(f"published peak {row['id']!r}: unit must be {' or '.join(PEAK_UNITS)} and view "
                             f"{' or '.join(PEAK_VIEWS)}, got {row['unit']!r} and {row['view']!r}")
        row = row | {"bytes": round(row["figure"] * PEAK_UNITS[row["unit"]])}
        if row["model"].endswith(".json"):         # the model as the run's tool built it (data/published_models/)
            row |= {"model": str(DATA_DIR.parent / row["model"]), "model_file": row["model"]}
        rows.append(row)
    return rows


def peak(run_id: str) -> dict:
    """One published run's peak (see `peaks`) by its id."""
    found = {r["id"]: r for r in peaks()}
    if run_id not in found:
        raise InputError(f"no published peak {run_id!r}: known runs are {', '.join(found)}")
    return found[run_id]
