"""Gradient accumulation (--grad-accum) and selective activation checkpointing (--checkpointing selective): each
option's effect in the estimate, and the estimate against the dry run (full size, fake tensors) and against the real
engines on the scaled twin, within 3% on every phase."""

import pytest

from helpers import __main__ as cli
from helpers import estimate, explore, models
from helpers.errors import InputError
from helpers.estimate import activations
from helpers.measure import dryrun, scaled
from helpers.training import TrainSetup

M = "llama-3.2-3b"


def worst_phase(a, b) -> float:
    """Largest relative difference of a phase between two results, over GPU and host (under 1 MiB counts 0)."""
    worst = 0.0
    for dev in ("gpu", "host"):
        for p, v in b.device(dev).phases.items():
            u = a.device(dev).phases[p]
            if abs(u - v) > 2**20:
                worst = max(worst, abs(u - v) / max(u, v))
    return worst


@pytest.mark.parametrize("options, message", [
    (dict(checkpointing="some"), "unknown checkpointing 'some': allowed are none, full, selective"),
    (dict(checkpointing="selective", grad_checkpointing=True), "grad_checkpointing=True means checkpointing 'full'"),
    (dict(grad_accum=0), "grad_accum must be a positive integer, got 0"),
    (dict(grad_accum=True), "grad_accum must be a positive integer, got True"),
    (dict(grad_accum=10**6), "grad_accum must be at most 4,096"),
    (dict(checkpointing="selective", lora_rank=8), "checkpointing 'selective' is modelled for full fine-tuning"),
])
def test_bad_options_are_named(options, message):
    with pytest.raises(InputError, match=message):
        TrainSetup(**options).validate()


def test_grad_checkpointing_is_full_checkpointing():
    a = estimate.run(M, TrainSetup(seq=1024, grad_checkpointing=True))
    b = estimate.run(M, TrainSetup(seq=1024, checkpointing="full"))
    assert a.gpu.phases == b.gpu.phases and TrainSetup(grad_checkpointing=True).checkpointing == "full"


def test_selective_lies_between_full_and_none():
    act = {ac: estimate.run(M, TrainSetup(precision="bf16", seq=4096, checkpointing=ac)).gpu.breakdown["forward"]["activations"]
           for ac in ("none", "full", "selective")}
    assert act["full"] < act["selective"] < act["none"]


def test_selective_keeps_every_other_matmul_and_the_attention_output():
    """Per token per Llama layer, bf16: q (2 x 3072) + v (2 x 1024) + gate (2 x 8192) + down (2 x 3072) projections,
    the flash output (2 x 3072) and fp32 logsumexp (4 x 24 heads)."""
    m = models.spec(M)
    s = TrainSetup(precision="bf16", seq=4096, checkpointing="selective")
    assert activations.selective_bytes(m, s) == 4096 * (2 * (3072 + 1024 + 8192 + 3072 + 3072) + 4 * 24)


def test_selective_on_a_mixture_of_experts_is_refused():
    with pytest.raises(InputError, match="selective checkpointing is modelled for dense decoder layers"):
        estimate.run("deepseek-v2-lite", TrainSetup(seq=128, checkpointing="selective"))


def test_accumulation_keeps_gradients_alive_in_the_next_forward():
    """Single GPU, bf16: the second micro batch's forward runs beside every gradient (2 bytes per parameter)."""
    m = models.spec(M)
    one = estimate.run(M, TrainSetup(precision="bf16", seq=1024))
    four = estimate.run(M, TrainSetup(precision="bf16", seq=1024, grad_accum=4))
    assert four.gpu.phases["forward"] - one.gpu.phases["forward"] == 2 * m.params
    assert four.gpu.phases["step"] == one.gpu.phases["step"]


def test_accumulation_with_zero2_offload_adds_deepspeeds_host_buffer():
    one = estimate.run(M, TrainSetup(strategy="zero2", seq=512, offload_optimizer=True, pin_memory=False))
    four = estimate.run(M, TrainSetup(strategy="zero2", seq=512, offload_optimizer=True, pin_memory=False, grad_accum=4))
    added = [i for i in four.items if i["name"].startswith("accumulated_grads_in_cpu")]
    assert len(added) == 1 and added[0]["bytes"] == 2 * models.spec(M).params
    assert four.host.phases["step"] - one.host.phases["step"] == added[0]["bytes"]


def test_zero3_accumulates_into_buffers_it_holds_anyway():
    one = estimate.run(M, TrainSetup(strategy="zero3", gpus=8, seq=512))
    four = estimate.run(M, TrainSetup(strategy="zero3", gpus=8, seq=512, grad_accum=4))
    assert one.gpu.phases == four.gpu.phases and one.host.phases == four.host.phases


@pytest.mark.parametrize("model, setup", [
    (M, TrainSetup(precision="bf16", adam_impl="fused", seq=1024, grad_accum=4)),
    (M, TrainSetup(strategy="ddp", gpus=4, seq=512, grad_accum=2)),
    (M, TrainSetup(strategy="zero2", gpus=4, seq=512, grad_accum=4)),
    ("llama-3-8b", TrainSetup(strategy="fsdp2", gpus=2, gpus_per_node=2, seq=1024, grad_accum=2,
                              checkpointing="selective")),
    (M, TrainSetup(precision="bf16", seq=4096, checkpointing="selective")),
    (M, TrainSetup(precision="fp32", seq=1024, checkpointing="selective")),
    (M, TrainSetup(precision="bf16-mixed", seq=1024, checkpointing="selective", attention="eager")),
    ("qwen2.5-32b", TrainSetup(precision="bf16", adam_impl="fused", seq=1024, checkpointing="selective")),
])
def test_estimate_agrees_with_the_dry_run(model, setup):
    """(Qwen2's q, k, v projections have biases: addmm, which the policy neither counts nor saves.)"""
    assert worst_phase(estimate.run(model, setup, lifecycle=False), dryrun.run(model, setup, progress=False)) < 0.03


@pytest.mark.parametrize("setup", [
    TrainSetup(precision="bf16", adam_impl="fused", batch=2, seq=128, grad_accum=4),
    TrainSetup(strategy="zero2", batch=2, seq=128, grad_accum=3, offload_optimizer=True),
    TrainSetup(precision="bf16", adam_impl="fused", batch=2, seq=256, checkpointing="selective"),
])
def test_estimate_agrees_with_the_real_engine_on_the_twin(setup):
    r = scaled.run("llama-3-8b", setup, steps=2, progress=False)
    twin, s = scaled.scaled_setup("llama-3-8b", setup)
    assert r.setup["grad_accum"] == setup.grad_accum and r.meta["losses"][-1] < r.meta["losses"][0]
    assert worst_phase(estimate.run(str(twin), s, lifecycle=False), r) < 0.03


def test_cli_and_explorer_take_both_options(capsys):
    import json

    assert cli.main(["estimate", "--model", M, "--checkpointing", "selective", "--grad-accum", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["setup"]["checkpointing"] == "selective" and out["setup"]["grad_accum"] == 8
    assert cli.main(["estimate", "--model", M, "--checkpointing", "full", "--grad-checkpointing"]) == 2
    assert "exclude each other" in capsys.readouterr().err
    ex = explore.Explorer(M, TrainSetup(gpu_gib=80))
    ex.set(checkpointing="selective", grad_accum=4)
    assert ex.setup.checkpointing == "selective" and ex.setup.grad_accum == 4 and ex.error is None
    ex.set(grad_checkpointing=True)
    assert ex.setup.checkpointing == "full" and (ex.setup.checkpointing == "full")
