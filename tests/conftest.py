import pytest

from helpers.training import TrainSetup


@pytest.fixture
def case1() -> TrainSetup:
    """Case 1 as reported: Llama-3-8B, ZeRO-2, one 80 GiB GPU, bf16, batch 1, seq 128, flash, checkpointing."""
    return TrainSetup(strategy="zero2", gpus=1, precision="bf16-mixed", batch=1, seq=128, attention="flash",
                      grad_checkpointing=True, gpu_gib=80)


@pytest.fixture
def scaled_agrees():
    """A check: `model`'s tiny twin trained for real on this CPU under `setup` for `steps` steps; its loss falls and
    every measured phase is within `rel` of the estimate of the same twin. Returns (scaled result, estimate)."""
    from helpers import estimate
    from helpers.measure import scaled

    def check(model: str, setup: TrainSetup, steps: int = 2, rel: float = 0.03):
        r = scaled.run(model, setup, steps=steps, progress=False)
        twin, s = scaled.scaled_setup(model, setup)
        e = estimate.run(str(twin), s)
        assert r.meta["losses"][-1] < r.meta["losses"][0]
        for phase, measured in r.gpu.phases.items():
            assert e.gpu.phases[phase] == pytest.approx(measured, rel=rel), phase
        return r, e
    return check


@pytest.fixture
def dry_agrees():
    """A check: the dry run of `model` under `setup` (the real step on fake tensors) against the estimate, every GPU
    phase within `rel`. Returns (dry run, estimate)."""
    from helpers import estimate
    from helpers.measure import dryrun

    def check(model: str, setup: TrainSetup, rel: float = 0.01):
        d, e = dryrun.run(model, setup, progress=False), estimate.run(model, setup)
        for phase, measured in d.gpu.phases.items():
            assert e.gpu.phases[phase] == pytest.approx(measured, rel=rel), phase
        return d, e
    return check
