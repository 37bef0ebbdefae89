"""A tied embedding under DeepSpeed ZeRO-1/2: the head's gradient is held until the embedding's backward makes the
other, and the two are added out of place before ZeRO's gradient hook takes the sum. The estimate missed these
copies (0.56 GiB on Llama-3.2-1B at ZeRO-2 over 8 GPUs, an under-estimate); checked against the re-enacted dry run at
full size (consistency) and against DeepSpeed 0.19.8 itself on the tied twin (truth: the estimate is not below it)."""

from __future__ import annotations

import pytest

from helpers import estimate, models
from helpers.measure import dryrun, scaled
from helpers.training import TrainSetup


@pytest.mark.parametrize("model", ["llama-3.2-1b", "gemma-2-2b"])
@pytest.mark.parametrize("changes", [dict(strategy="zero2", gpus=8), dict(strategy="zero2", gpus=8,
                                     offload_optimizer=True), dict(strategy="zero1", gpus=4)])
def test_tied_embedding_backward_agrees_with_the_dry_run(model, changes):
    assert models.spec(model).tied
    s = TrainSetup(seq=256, **changes)
    e, d = estimate.run(model, s), dryrun.run(model, s, progress=False)
    for phase in ("backward", "steady"):
        assert e.gpu.phases[phase] == pytest.approx(d.gpu.phases[phase], rel=2e-3), phase
    tied = [i for i in e.items if i["name"].startswith("tied embedding at the end of backward")]
    embed = models.spec(model).group_params["embed"]
    assert len(tied) == 1 and tied[0]["bytes"] == (2 if changes["strategy"] == "zero1" else 3) * 2 * embed


@pytest.mark.parametrize("strategy", ["zero1", "zero2"])
def test_deepspeed_itself_is_not_above_the_estimate_on_a_tied_twin(strategy):
    """At seq 8 the logits are small, so the end of backward (the tied sum) is the backward peak; DeepSpeed holds the
    three copies of the embedding's gradient there. The twin's reduce bucket has not filled by then, so DeepSpeed has
    not yet made its gradient partition, which the estimate places (at full size the bucket fills many times first):
    the estimate stays above, by less than a quarter."""
    s = TrainSetup(strategy=strategy, batch=1, seq=8)
    r = scaled.run("llama-3.2-1b", s, progress=False)
    twin, ts = scaled.scaled_setup("llama-3.2-1b", s)
    e = estimate.run(str(twin), ts)
    embed = models.spec(str(twin)).group_params["embed"]
    assert r.gpu.breakdown["backward"]["temporaries"] >= 2 * 2 * embed             # head's and embedding's at least
    # (the twin's rotary buffers, ~1 KB, are not among the estimate's items)
    assert r.gpu.phases["backward"] <= e.gpu.phases["backward"] + 2048 < 1.25 * r.gpu.phases["backward"]
