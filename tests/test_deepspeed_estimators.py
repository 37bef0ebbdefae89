"""DeepSpeed's own estimators, called through helpers.deepspeed_estimators: case 6's figures, exactly."""

import pytest
import torch

from helpers import deepspeed_estimators as de
from helpers import models
from helpers.errors import InputError
from helpers.measure import engines
from helpers.training import TrainSetup

M = "qwen2.5-32b"


def test_counts_without_the_head_are_the_base_model_s():
    total, largest = de.counts(M)
    assert total == models.spec(M).params - models.spec(M).lm_head_params == 31_985_308_672
    assert largest == 152_064 * 5_120                      # the embedding is the largest module
    assert de.counts(M, with_head=True)[0] == 32_763_876_352


def test_case6_figures_are_reproduced_exactly():
    table = de.cold(*de.counts(M))
    assert (table.row(True, True).cpu_gib, table.row(True, True).gpu_gib) == (804.29, 2.90)
    assert (table.row(True, False).cpu_gib, table.row(True, False).gpu_gib) == (714.93, 62.48)
    assert table.row(False, False).gpu_gib == 539.10
    assert "804.29GB" in table.text and "OffloadDeviceEnum" not in table.text
    with_head = de.cold(*de.counts(M, with_head=True))
    assert with_head.row(True, True).cpu_gib == 823.87 and with_head.row(False, False).gpu_gib == 552.15


def test_zero2_row_is_not_the_reported_one():
    row = de.cold(de.counts(M)[0], stage=2).row(True)
    assert (row.cpu_gib, row.gpu_gib) == (714.93, 59.58)    # 62.5 GPU + 715 host is ZeRO-3's optimizer-only row


def test_bytes_agree_with_the_printed_table():
    P, L = de.counts(M)
    b = de.zero3_bytes(P, L, True, True)
    assert round(b["host"] / 2**30, 2) == 804.29 and round(b["gpu"] / 2**30, 2) == 2.90


def test_the_meta_device_trap():
    """On a meta-device model every data_ptr() is 0: the live estimators count only the last parameter."""
    assert de.live_counts(de.meta_model(M))[0] == 778_567_680             # lm_head, the last parameter
    assert de.live_counts(de.meta_model(M, with_head=False))[0] == 5_120   # the final norm
    twin = str(models.scaled_path(M))
    real = engines.build_model(twin, TrainSetup(precision="bf16"), torch.bfloat16, "sdpa")
    assert de.live_counts(real) == de.counts(twin, with_head=True)          # a real model counts right


@pytest.mark.parametrize("kwargs,needle", [
    (dict(total_params=0), "total_params must be a positive integer"),
    (dict(total_params=10, stage=1), "stages 2 and 3"),
    (dict(total_params=10, largest_layer_params=-1), "largest_layer_params"),
])
def test_bad_input_is_named(kwargs, needle):
    with pytest.raises(InputError) as err:
        de.cold(**kwargs)
    assert needle in str(err.value)
