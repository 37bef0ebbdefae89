"""LoRA and 8-bit AdamW: the estimator's counts against peft's and bitsandbytes' own tensors, and against runs."""

import pytest
import torch

from helpers import estimate, models
from helpers.errors import InputError
from helpers.estimate import states
from helpers.measure import dryrun, engines, scaled
from helpers.training import TrainSetup

M = "llama-3-8b"
P = 8_030_261_248


def test_lora_parameter_count_is_peft_s():
    """Llama-3-8B, r=16 on all linear layers: 41,943,040 adapters (peft's count on the real twin and the formula)."""
    assert models.spec(M).lora_params(16) == 41_943_040
    twin = models.scaled_path(M)
    net = engines.build_model(str(twin), TrainSetup(lora_rank=8, precision="bf16"), torch.bfloat16, "sdpa")
    trainable = sum(p.numel() for p in net.parameters() if p.requires_grad)
    assert trainable == models.spec(str(twin)).lora_params(8)
    assert sum(p.numel() for p in net.parameters() if not p.requires_grad) == models.spec(str(twin)).params


def test_lora_model_states_are_exact():
    r = estimate.run(M, TrainSetup(strategy="zero2", lora_rank=16, seq=128))
    T = 41_943_040
    b = r.gpu.breakdown["step"]
    assert b["parameters"] == 2 * P + 2 * T            # frozen base bf16 + adapters bf16 (DeepSpeed casts the module)
    assert b["master_weights"] == 4 * T and b["optimizer_states"] == 8 * T


def test_adamw8bit_state_bytes_are_bitsandbytes_own():
    """The rule (uint8 x 2 + fp32 absmax per 256 elements; fp32 below 4096 elements; two code books) against the
    states bitsandbytes makes for the twin's real parameters."""
    import bitsandbytes as bnb

    twin = str(models.scaled_path(M))
    net = engines.build_model(twin, TrainSetup(precision="bf16"), torch.bfloat16, "sdpa")
    opt = bnb.optim.AdamW8bit(net.parameters())
    for p in net.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    seen, total = set(), 0
    for st in opt.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor) and v.numel() > 1 and v.untyped_storage().data_ptr() not in seen:
                seen.add(v.untyped_storage().data_ptr())
                total += v.numel() * v.element_size()
    assert total == states.adamw8bit_state_bytes(models.spec(twin))


def test_8bit_states_are_about_2_bytes_per_param_at_full_size():
    r = estimate.run(M, TrainSetup(precision="bf16", optimizer="adamw-8bit", seq=128))
    per = r.per_param("gpu", "step")
    assert 2.0 < per["optimizer_states"] < 2.04
    assert per.get("temporaries", 0) == 0


@pytest.mark.parametrize("setup", [
    TrainSetup(precision="bf16", optimizer="adamw-8bit", batch=2, seq=64),
    TrainSetup(lora_rank=8, batch=2, seq=64),
    TrainSetup(strategy="zero2", lora_rank=8, batch=2, seq=64, offload_optimizer=True),
], ids=["8bit", "lora-autocast", "zero2-lora-offload"])
def test_scaled_runs_agree_with_the_estimate(setup):
    r = scaled.run(M, setup, progress=False)
    twin, s = scaled.scaled_setup(M, setup)
    e = estimate.run(str(twin), s, lifecycle=False)
    assert r.meta["losses"][-1] < r.meta["losses"][0]
    for device in ("gpu", "host"):
        for phase, measured in r.device(device).phases.items():
            assert abs(e.device(device).phases[phase] - measured) <= 0.03 * max(measured, 1), (device, phase)
    step = r.gpu.breakdown["step"]
    if setup.lora_rank:           # the frozen base has no gradient and no optimizer state
        adapters = models.spec(str(twin)).lora_params(8)
        assert step["optimizer_states"] <= 8 * adapters


def test_lora_dry_run_agrees_with_the_estimate_at_full_size():
    s = TrainSetup(strategy="zero2", lora_rank=16, seq=128, grad_checkpointing=True, attention="flash")
    d, e = dryrun.run(M, s, progress=False), estimate.run(M, s, lifecycle=False)
    for phase, dry in d.gpu.phases.items():
        assert abs(e.gpu.phases[phase] - dry) <= 0.01 * dry, phase


@pytest.mark.parametrize("changes,needle", [
    (dict(lora_rank=0), "lora_rank must be a positive integer"),
    (dict(lora_rank=8, strategy="fsdp1", gpus=2, optimizer="adamw-8bit"), "'adamw-8bit' (bitsandbytes) is modelled with strategies"),
    (dict(optimizer="adam-4bit"), "unknown optimizer 'adam-4bit'"),
    (dict(optimizer="adamw-8bit", strategy="zero3"), "'adamw-8bit' (bitsandbytes) is modelled with strategies"),
    (dict(optimizer="adamw-8bit", adam_impl="fused"), "leave adam_impl unset"),
])
def test_bad_options_are_named(changes, needle):
    with pytest.raises(InputError) as err:
        TrainSetup(**changes).validate()
    assert needle in str(err.value)


def test_8bit_has_no_dry_run():
    with pytest.raises(InputError, match="cannot run on fake tensors"):
        dryrun.run(M, TrainSetup(precision="bf16", optimizer="adamw-8bit", seq=128), progress=False)
