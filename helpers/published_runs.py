"""Published training runs beside ours, like with like.

Each run in data/published.json 'peaks' (torchtitan's Llama 3.1 8B FSDP preset; LitGPT's config-hub fine-tunes;
PEFT's MetaMathQA runs; fms-acceleration's plain-Trainer Mistral-7B benchmarks; torchtune's README table) is written as
a TrainSetup over a catalogue model (or the model as the run's tool built it, data/published_models/), estimated and
dry-run, and compared with the figure its tool printed in the same view:

- a published *reserved* peak (torch.cuda's reserved peak: what torchtitan logs, what PEFT's results record) with
  the dry run's modelled reserved view (`helpers.measure.reserved`: the step's allocations replayed through the caching allocator's
  rules; the CUDA context and NCCL's buffers are outside it, as they are outside torch's statistic);
- a published *allocated* peak (torch.cuda.max_memory_allocated(), what LitGPT prints) with the estimate and the dry
  run's allocated peak in blocks (the allocator model's rounding, as torch counts it).

The tensors alone against a reserved figure are kept beside as the unlike comparison. Where a figure lands far from
the published one, the row's `not_modelled` says what the published run does that its set-up does not express; the
model is never tuned to a published figure. `python -m helpers.bench published` records the comparison in
data/results/published_vs_ours.json (tests/test_published_runs.py recomputes it).
"""

from __future__ import annotations

from helpers import estimate, published
from helpers.training import TrainSetup

RESULTS_FILE = "published_vs_ours.json"     # under data/results/


def setup(row: dict) -> TrainSetup:
    """A published run's set-up (its 'setup' fields over TrainSetup's defaults), validated."""
    return TrainSetup(**row["setup"]).validate()


def compare(run_id: str, dry=None) -> dict:
    """One published run against ours (bytes): the published peak and its view, the estimate's GPU phases, the dry
    run's allocated phases (tensor bytes and allocator blocks) and modelled reserved phases, their peaks, and the
    relative differences `ours / published - 1` like with like ('like_for_like') and unlike ('tensors_vs_published',
    only where the published figure is reserved). `dry`: the dry run's Result if already made."""
    from helpers.measure import dryrun

    row = published.peak(run_id)
    s = setup(row)
    e = estimate.run(row["model"], s)
    d = dry if dry is not None else dryrun.run(row["model"], s, progress=False)
    blocks = {p: v["allocated"] for p, v in d.meta["allocator"]["phases"].items()}
    ours = {"estimate_allocated": e.gpu.peak_bytes, "dry_run_allocated": d.gpu.peak_bytes,
            "dry_run_allocated_blocks": max(blocks.values()), "dry_run_reserved": max(d.gpu.reserved.values())}
    target = row["bytes"]
    rel = lambda ours_bytes: ours_bytes / target - 1
    if row["view"] == "reserved":
        like = {"dry_run_reserved": rel(ours["dry_run_reserved"])}
        unlike = {"estimate_allocated": rel(ours["estimate_allocated"]),
                  "dry_run_allocated": rel(ours["dry_run_allocated"])}
    else:
        like = {"estimate_allocated": rel(ours["estimate_allocated"]),
                "dry_run_allocated_blocks": rel(ours["dry_run_allocated_blocks"])}
        unlike = {}
    return {"id": run_id, "model": row.get("model_file", row["model"]), "setup": e.setup, "view": row["view"],
            "published": {"figure": row["figure"], "unit": row["unit"], "bytes": target, "stat": row["stat"],
                          "gpu": row["gpu"], "source": row["source"], "url": row["url"]},
            "ours": ours, "like_for_like": like, "tensors_vs_published": unlike,
            "phases": {"estimate": e.gpu.phases, "dry_run_allocated": d.gpu.phases,
                       "dry_run_allocated_blocks": blocks, "dry_run_reserved": d.gpu.reserved},
            "not_modelled": row["not_modelled"]}
