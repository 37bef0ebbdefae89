"""The one training loop every measuring mode shares (helpers.measure.steps), and the one answer to "has this set-up a
dry run?" (helpers.measure.dryrun.supports)."""

import contextlib
from pathlib import Path

import pytest
import torch

from helpers import estimate, models
from helpers.errors import InputError
from helpers.measure import dryrun, gpu, scaled
from helpers.measure.steps import Hooks, run_steps
from helpers.training import TrainSetup

TINY = str(Path(__file__).parent / "data" / "tiny-llama.json")


class _Engine:
    def __init__(self, log, micro=True):
        self.log = log
        if micro:
            self.micro_step = lambda: log.append("micro_step")

    def forward(self, ids):
        self.log.append("forward")
        return torch.tensor(1.0)

    def backward(self, loss):
        self.log.append("backward")

    def step(self):
        self.log.append("step")


class _Tracker:
    def __init__(self, log):
        self.log = log

    @contextlib.contextmanager
    def phase(self, name, activity=None):
        self.log.append(f"[{name}]")
        yield


class _Seen(Hooks):
    def __init__(self):
        self.before_, self.after_, self.losses = [], [], []

    def before(self, phase, activity):
        self.before_.append((phase, activity))

    def after(self, phase, activity, seconds):
        assert seconds >= 0
        self.after_.append((phase, activity))

    def loss(self, iteration, loss):
        self.losses.append(iteration)


def test_run_steps_runs_grad_accum_micro_batches_per_iteration_in_the_phases_every_mode_names():
    log, hooks = [], _Seen()
    run_steps(_Engine(log), _Tracker(log), None, grad_accum=2, iterations=2, hooks=hooks)
    assert log == ["[forward]", "forward", "[backward]", "backward", "micro_step",
                   "[forward]", "forward", "[backward]", "backward", "[step]", "step",
                   "[steady]", "forward", "[steady]", "backward", "micro_step",
                   "[steady]", "forward", "[steady]", "backward", "[step]", "step"]
    assert hooks.before_ == hooks.after_ and hooks.before_[-1] == ("step", "step")
    assert hooks.losses == [0, 1]                              # the first micro batch's loss of each iteration


def test_run_steps_without_the_last_step_is_the_dry_runs_step_then_steady():
    log = []
    run_steps(_Engine(log, micro=False), _Tracker(log), None, grad_accum=1, iterations=2, last_step=False)
    assert log == ["[forward]", "forward", "[backward]", "backward", "[step]", "step",
                   "[steady]", "forward", "[steady]", "backward"]


def test_gpu_mode_runs_grad_accum_micro_batches(monkeypatch):
    """GPU mode ran one micro batch whatever grad_accum said (2 forwards in 2 steps at grad_accum 4, and the steady
    phase of grad_accum 1); through the shared loop it runs 8, and the first micro batch's gradients stay alive through
    the others as the estimate and the dry run count them. On CPU the census lands under 'host'."""
    calls = {"forward": 0}
    real = scaled.TorchEngine.forward

    def forward(self, ids):
        calls["forward"] += 1
        return real(self, ids)

    monkeypatch.setattr(scaled.TorchEngine, "forward", forward)
    setup = TrainSetup(seq=16, grad_accum=4)
    r = gpu.measure(models.spec(TINY), setup, torch.device("cpu"), steps=2)
    assert calls["forward"] == 2 * 4
    measured, estimated = r.host.phases["steady"], estimate.run(TINY, setup).gpu.phases["steady"]
    one = gpu.measure(models.spec(TINY), setup.replace(grad_accum=1), torch.device("cpu"), steps=2).host.phases
    assert abs(measured - estimated) <= 0.01 * estimated, (measured, estimated)
    assert measured > one["steady"]                                  # the held gradients


NO_DRY = [
    (TrainSetup(strategy="fsdp1", gpus=2, offload_optimizer=True, offload_params=True), "FSDP1 with CPU offload"),
    (TrainSetup(strategy="fsdp2", gpus=4, context_parallel=2), "context_parallel has no dry run"),
    (TrainSetup(strategy="zero3"), "no dry run for strategy 'zero3'"),
    (TrainSetup(optimizer="adamw-8bit"), "adamw-8bit"),
    (TrainSetup(resume=True), "resume"),
]


@pytest.mark.parametrize("setup,why", NO_DRY)
def test_supports_says_no_with_the_reason_run_gives(setup, why):
    ok, reason = dryrun.supports(setup)
    assert not ok and why.lower() in reason.lower()
    with pytest.raises(InputError) as exc:
        dryrun.run(TINY, setup, progress=False)
    assert str(exc.value) == reason


@pytest.mark.parametrize("setup", [
    TrainSetup(seq=16),
    TrainSetup(seq=16, strategy="ddp", gpus=2, grad_accum=2),
    TrainSetup(seq=16, strategy="zero2", gpus=2, offload_optimizer=True),
    TrainSetup(seq=16, strategy="fsdp2", gpus=2, offload_optimizer=True, offload_params=True),
    TrainSetup(seq=16, strategy="fsdp1", gpus=2),
    TrainSetup(seq=16, strategy="fsdp2", gpus=4, tensor_parallel=2),
    TrainSetup(seq=16, lora_rank=4, checkpointing="full"),
])
def test_where_supports_says_yes_the_dry_run_runs(setup):
    assert dryrun.supports(setup) == (True, "")
    r = dryrun.run(TINY, setup, progress=False)
    assert r.mode == "dry-run" and r.gpu.peak_bytes > 0


def test_recheck_takes_the_estimate_where_there_is_no_dry_run():
    x = dryrun.recheck("llama-3-8b", TrainSetup(strategy="fsdp1", gpus=2, offload_optimizer=True, offload_params=True,
                                                gpu_gib=80))
    assert x["reserved"] is None and "no dry run" in x["basis"] and x["result"].mode == "estimate"
