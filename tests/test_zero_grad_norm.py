"""DeepSpeed's gradient norm at the step (ZeRO-1/2/3 without optimizer offload): each gradient copied to float64 in
turn while its norm is taken (DeepSpeed 0.19.8 get_grad_norm_direct, runtime/zero/utils.py get_norm_dtype). Found by
the real engine: the twins' step was 1.8 MiB (ZeRO-1/2) and 8.2 MiB (10.4%, ZeRO-3) over the estimate, the
embedding's gradient in float64 being the step's largest buffer."""

import pytest

from helpers import estimate, models
from helpers.deepspeed_rules import largest_partition_piece
from helpers.measure import dryrun, scaled
from helpers.training import TrainSetup
from helpers.units import MiB


def test_the_largest_piece_is_a_whole_tensor_or_the_part_inside_one_partition():
    assert largest_partition_piece([10, 3, 3], 16) == 10           # all on rank 0
    assert largest_partition_piece([10, 3, 3], 8) == 8             # the first tensor crosses into rank 1
    assert largest_partition_piece([6, 6, 6], 8) == 6              # 6 | 2+4 | 4+2: whole tensors are the largest
    assert largest_partition_piece([5, 6], 8) == 5                 # 5 | 3+3: the second split in two pieces


def _norm_item(r):
    return [i for i in r.items if i["name"] == "the gradient norm's float64 copy of one gradient"]


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3"])
def test_the_step_of_deepspeeds_twin_is_the_estimates(strategy, scaled_agrees):
    """The twin trained by DeepSpeed itself: the step's peak is the embedding's gradient in float64 beside the
    states; the estimate's step within 0.1 MiB of it (every phase within 5%: ZeRO-3's gathered parameters are 4% over
    in forward), and its item is 8 B x the largest piece a rank holds."""
    s = TrainSetup(strategy=strategy, batch=2, seq=256, precision="bf16-mixed")
    r, e = scaled_agrees("qwen2.5-0.5b", s, rel=0.05)
    assert abs(e.gpu.phases["step"] - r.gpu.phases["step"]) < 0.1 * MiB
    m = models.spec(str(scaled.scaled_setup("qwen2.5-0.5b", s)[0]))
    [item] = _norm_item(e)
    assert item["bytes"] == 8 * max(t.numel for t in m.tensors) and item["phases"] == ["step"]


def test_offloaded_optimizers_and_plain_torch_take_no_float64_copy():
    for s in (TrainSetup(strategy="zero2", offload_optimizer=True), TrainSetup(strategy="zero3", offload_optimizer=True),
              TrainSetup(strategy="ddp", gpus=2), TrainSetup(strategy="fsdp2", gpus=2)):
        assert not _norm_item(estimate.run("qwen2.5-0.5b", s, lifecycle=False)), s.strategy


def test_under_zero2_on_eight_gpus_a_rank_copies_its_whole_partition():
    """Qwen2.5-0.5B's embedding (136 M elements) is larger than a rank's 1/8 (62 M): rank 0's piece is its whole
    partition, 471 MiB in float64, beside the bf16 gradient partition; the dry run re-enacts the copy (consistency:
    the same partition rule, helpers.deepspeed_rules)."""
    s = TrainSetup(strategy="zero2", gpus=8, batch=1, seq=512)
    e = estimate.run("qwen2.5-0.5b", s, lifecycle=False)
    part = -(-models.spec("qwen2.5-0.5b").params // 8)
    assert _norm_item(e)[0]["bytes"] == 8 * part
    d = dryrun.run("qwen2.5-0.5b", s, progress=False)
    assert abs(e.gpu.phases["step"] - d.gpu.phases["step"]) < MiB
    assert d.gpu.breakdown["step"]["gradients"] >= 8 * part
