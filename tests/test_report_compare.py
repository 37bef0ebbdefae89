"""report.compare: the notebooks' one comparison of two figures, printed and asserted."""

import pytest

from helpers import report
from helpers.units import GiB, MiB


def test_rows_within_tolerance_are_printed_in_one_unit(capsys):
    got = report.compare([("forward", 10 * GiB, 10 * GiB), ("step", int(10.2 * GiB), 10 * GiB)], 0.03,
                         names=("estimate", "dry run"), title="phase")
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["phase", "estimate", "dry", "run", "difference", "(GiB)"]
    assert out[2].split()[:3] == ["step", "10.200", "10.000"] and got["step"] == pytest.approx(0.02)


def test_a_row_outside_tolerance_names_itself_both_figures_and_the_tolerance(capsys):
    with pytest.raises(AssertionError, match=r"step: estimate 11\.000 GiB vs measured 10\.000 GiB, 1\.000 GiB apart; "
                                             r"at most 3% \(0\.300 GiB\) allowed"):
        report.compare([("forward", GiB, GiB), ("step", 11 * GiB, 10 * GiB)], 0.03)


def test_small_figures_are_in_mib_and_a_floor_judges_near_empty_rows(capsys):
    report.compare([("host", 3 * MiB, 2 * MiB)], 0.03, floor=64 * MiB)        # 1 MiB apart, within 3% of 64 MiB
    assert "(MiB)" in capsys.readouterr().out
    with pytest.raises(AssertionError):
        report.compare([("host", 3 * MiB, 2 * MiB)], 0.03)


def test_per_param_at_step_is_the_rule_of_thumb_for_mixed_precision_adamw():
    from helpers import estimate
    from helpers.training import TrainSetup

    r = estimate.run("llama-3-8b", TrainSetup(adam_impl="fused", seq=128))
    assert round(report.per_param_at_step(r, "gpu"), 1) == 16.0             # 4 + 4 + 8 B/param (fp32 weights, grads, Adam)
    assert report.per_param_at_step(r, "gpu", ("optimizer_states",)) == pytest.approx(8.0, abs=0.01)
