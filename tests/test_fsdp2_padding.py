"""FSDP2 with more ranks than a tensor has rows: each rank keeps a whole row, padded (torch `_fsdp_param.py`
`_init_sharded_param`), and gathers every rank's padded row. An MoE's 3-D expert tensors (8 experts in Mixtral) hit
this from 16 ranks on: the estimate used numel / N for full fine-tuning (half of what each rank holds), while LoRA's
frozen base was padded. Both now shard as FSDP2 does, and the estimate is checked against a dry run of FSDP2 itself."""

from __future__ import annotations

import pytest

from helpers import estimate, models
from helpers.estimate.states import fsdp2_shard
from helpers.training import TrainSetup
from helpers.units import MiB


def _item(setup, model, start):
    return next(i for i in estimate.items(model, setup) if i.name.startswith(start))


def test_full_fine_tuning_keeps_padded_shards():
    m = models.spec("mixtral-8x7b")
    s = TrainSetup(strategy="fsdp2", gpus=16, seq=256)
    shard = sum(fsdp2_shard(t, 16) for t in m.tensors)
    assert _item(s, m, "sharded parameters").nbytes == shard * 4             # fp32 under bf16-mixed
    experts = [t for t in m.tensors if t.ndim == 3]
    assert experts and all(fsdp2_shard(t, 16) == t.numel // 8 for t in experts)   # one whole expert of 8 per rank
    assert shard > -(-m.params // 16) * 1.9                                    # nearly twice numel / N


def test_full_fine_tuning_and_lora_hold_the_same_base_shards():
    m = models.spec("mixtral-8x7b")
    full = _item(TrainSetup(strategy="fsdp2", gpus=64, seq=256, precision="bf16"), m, "sharded parameters")
    lora = _item(TrainSetup(strategy="fsdp2", gpus=64, seq=256, precision="bf16", lora_rank=16), m,
                 "frozen base partitions")
    assert full.nbytes == lora.nbytes


def test_more_ranks_than_experts_no_longer_lowers_the_estimate_below_fewer_ranks():
    """Past 8 ranks Mixtral's experts stop shrinking per rank: the parameters' share on 64 ranks is no smaller than on
    8 x 1/8 of them would suggest, and the all-gather of a block grows with the ranks (each sends a padded expert)."""
    def peak(g):
        return estimate.run("mixtral-8x7b", TrainSetup(strategy="fsdp2", gpus=g, seq=256)).gpu.peak_bytes
    assert peak(64) > peak(8) / 8


@pytest.mark.parametrize("model,gpus", [("qwen1.5-moe-a2.7b", 64)])
def test_estimate_against_a_dry_run_of_fsdp2_with_more_ranks_than_experts(model, gpus):
    """Each phase within 3% of the real fully_shard step on fake tensors, and never under it by more than 16 MiB at the
    phases where the backward's post-backward of a block (padded experts) is the peak."""
    from helpers.measure import dryrun

    s = TrainSetup(strategy="fsdp2", gpus=gpus, gpus_per_node=8, seq=256)
    e, d = estimate.run(model, s), dryrun.run(model, s, progress=False)
    for phase, got in d.gpu.phases.items():
        want = e.gpu.phases[phase]
        assert abs(want - got) <= max(0.03 * got, 16 * MiB), (phase, want, got)
    for phase in ("backward", "steady"):
        assert e.gpu.phases[phase] >= d.gpu.phases[phase] - 16 * MiB, phase


def test_the_report_says_where_fsdp2_pads():
    from helpers import report

    padded = estimate.run("mixtral-8x7b", TrainSetup(strategy="fsdp2", gpus=64, seq=256))
    pad = padded.meta["fsdp2_padding"]
    assert pad["rows"] == 8 and pad["ranks"] == 64 and pad["times"] == pytest.approx(8.0, rel=0.01)
    assert "FSDP2 pads" in report.table(padded) and "expert parallelism" in report.table(padded)
    dense = estimate.run("llama-3-8b", TrainSetup(strategy="fsdp2", gpus=8))
    assert dense.meta["fsdp2_padding"] is None and "FSDP2 pads" not in report.table(dense)
