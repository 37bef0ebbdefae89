"""fp16 mixed precision (precision 'fp16-mixed': the HF Trainer's `fp16`, accelerate's mixed_precision fp16, on GPUs
without bf16): torch autocast in fp16 with GradScaler on single and ddp, the same bytes per value as bf16-mixed plus
the scaler's scalars; against dry runs and a scaled run with torch's GradScaler; refused where an engine scales the
loss its own way; read from the tools' files."""

import json

import pytest

from helpers import estimate
from helpers.errors import InputError
from helpers.readers import read
from helpers.training import TrainSetup

M = "llama-3.2-1b"


@pytest.mark.parametrize("kw", [
    dict(seq=1024, batch=2, adam_impl="fused"),
    dict(seq=1024, batch=2, lora_rank=16, base_weights="nf4"),          # QLoRA on a T4: an fp16 base and compute
    dict(seq=1024, batch=1, strategy="ddp", gpus=2, checkpointing="full"),
], ids=["full", "qlora", "ddp-ckpt"])
def test_dry_run_with_grad_scaler_agrees_with_the_estimate(kw, dry_agrees):
    dry_agrees(M, TrainSetup(precision="fp16-mixed", **kw))


def test_the_same_bytes_as_bf16_mixed_but_the_scaler():
    s = TrainSetup(precision="fp16-mixed", seq=1024, batch=2, adam_impl="fused")
    fp16, bf16 = estimate.run(M, s), estimate.run(M, s.replace(precision="bf16-mixed"))
    for phase in fp16.gpu.phases:
        assert fp16.gpu.phases[phase] - bf16.gpu.phases[phase] == (0 if phase in ("setup", "forward") else 12), phase
    assert any(i["name"].startswith("GradScaler") for i in fp16.items)
    assert any(i["name"].startswith("fp16 weight copies") for i in fp16.items)


def test_scaled_run_with_torchs_grad_scaler_agrees_with_the_estimate(scaled_agrees):
    """The twin trained for real on this CPU under fp16 autocast with torch.amp.GradScaler: the loss falls and every
    phase is within 3% of the estimate."""
    r, _ = scaled_agrees("llama-3-8b", TrainSetup(precision="fp16-mixed", batch=2, seq=128, adam_impl="fused"), steps=3)
    assert r.gpu.breakdown["step"]["optimizer_states"] > 0


@pytest.mark.parametrize("kw,needle", [
    (dict(strategy="zero2"), "DeepSpeed's own fp16 path (its loss scaler and overflow checks) is not modelled"),
    (dict(strategy="fsdp2", gpus=2), "modelled with strategies single and ddp (torch autocast with GradScaler)"),
    (dict(strategy="ddp", gpus=2, tensor_parallel=2), "with tensor or context parallelism is not modelled"),
    (dict(lora_rank=8, adapter_dtype="bf16"), "GradScaler unscales only fp32 gradients"),
])
def test_where_an_engine_scales_its_own_way_it_is_refused(kw, needle):
    with pytest.raises(InputError) as err:
        TrainSetup(precision="fp16-mixed", **kw).validate()
    assert needle in str(err.value) and "\n" not in str(err.value)


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_readers_take_fp16(tmp_path):
    """axolotl's and LLaMA-Factory's `fp16: true` and TRL's `fp16`: fp16-mixed on one GPU; under DeepSpeed ZeRO-2
    (axolotl's deepspeed file) estimated as bf16-mixed and listed as not modelled."""
    ax = "base_model: meta-llama/Llama-3.2-1B\nmicro_batch_size: 2\nsequence_len: 1024\nfp16: true\n"
    one = read([_write(tmp_path, "a.yaml", ax)])
    assert one.setup.precision == "fp16-mixed" and "fp16" not in {n.key for n in one.not_modelled}
    _write(tmp_path, "ds.json", json.dumps({"zero_optimization": {"stage": 2}, "fp16": {"enabled": "auto"},
                                            "bf16": {"enabled": "auto"}}))
    zero = read([_write(tmp_path, "b.yaml", ax + "deepspeed: ds.json\n")])
    assert zero.setup.strategy == "zero2" and zero.setup.precision == "bf16-mixed"
    assert any("fp16" in n.key for n in zero.not_modelled)
    lf = read([_write(tmp_path, "lf.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\nfinetuning_type: lora\n"
                                           "fp16: true\n")])
    assert lf.setup.precision == "fp16-mixed"
    trl = read([_write(tmp_path, "t.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\nfp16: true\n")])
    assert trl.setup.precision == "fp16-mixed"
