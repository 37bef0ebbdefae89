"""The loss alone (helpers.measure.cross_entropy) and the fused cross-entropy in dry and scaled runs."""

import pytest

from helpers import estimate
from helpers.errors import InputError
from helpers.measure import cross_entropy as ce
from helpers.measure import dryrun, scaled
from helpers.training import TrainSetup


def test_plain_loss_holds_twelve_bytes_per_logit_in_backward():
    """log_softmax's backward: its output, the incoming gradient and its result, three fp32 E-sized tensors."""
    T, H, V = 512, 64, 1000
    for dtype in ("fp32", "bf16"):
        peak = ce.dry(T, H, V, dtype, "plain")["peak_above_inputs"]
        assert 12 * T * V <= peak < 12 * T * V + 64


def test_chunked_loss_is_much_smaller_for_real_and_computes_the_same():
    plain, chunked = (ce.real(16384, 256, 8016, "fp32", impl) for impl in ce.IMPLS)    # Llama's vocab/hidden ratio
    assert chunked["peak_above_inputs"] < plain["peak_above_inputs"] / 4
    assert abs(plain["loss"] - chunked["loss"]) < 1e-4 * plain["loss"]
    a = ce.agreement(512, 64, 1000, "fp32")
    assert max(a["loss_rel"], a["grad_input_rel"], a["grad_weight_rel"]) < 1e-5


def test_fused_ce_dry_run_agrees_with_the_estimate():
    s = TrainSetup(precision="bf16", adam_impl="fused", batch=4, seq=2048, fused_ce=True, grad_checkpointing=True)
    d, e = dryrun.run("llama-3.2-3b", s, progress=False), estimate.run("llama-3.2-3b", s)
    for phase, dry in d.gpu.phases.items():
        assert abs(e.gpu.phases[phase] - dry) <= 0.03 * dry, phase
    plain = dryrun.run("llama-3.2-3b", s.replace(fused_ce=False), progress=False)
    assert d.gpu.breakdown["forward"]["logits"] < plain.gpu.breakdown["forward"]["logits"] / 5


def test_fused_ce_scaled_run_trains():
    r = scaled.run("llama-3-8b", TrainSetup(precision="bf16", adam_impl="fused", batch=2, seq=64, fused_ce=True),
                   progress=False)
    assert r.meta["losses"][-1] < r.meta["losses"][0]
    assert set(r.meta["phase_s"]) == {"forward", "backward", "step"}


@pytest.mark.parametrize("kwargs,needle", [
    (dict(tokens=0, hidden=8, vocab=8), "tokens must be a positive integer"),
    (dict(tokens=8, hidden=8, vocab=8, dtype="fp8"), "unknown dtype 'fp8'"),
    (dict(tokens=8, hidden=8, vocab=8, impl="liger"), "unknown implementation 'liger'"),
])
def test_bad_input_is_named(kwargs, needle):
    with pytest.raises(InputError) as err:
        ce.dry(**kwargs)
    assert needle in str(err.value)


def test_an_oversized_real_measurement_is_refused_before_it_starts():
    with pytest.raises(InputError, match="refused"):
        ce.real(1 << 20, 4096, 128256, "bf16", "plain")
