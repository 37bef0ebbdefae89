"""The LoRA adapters' dtype (TrainSetup.adapter_dtype): peft's default, get_peft_model(autocast_adapter_dtype=True),
upcasts adapters on a bf16 base to fp32; without autocast each adapted layer then casts its input to fp32 and keeps
that copy. The estimate against dry runs through peft itself and a scaled run on this CPU, the refusals, and the
reader that sets it (LLaMA-Factory's pure_bf16)."""

import pytest

from helpers import estimate
from helpers.errors import InputError
from helpers.measure import dryrun
from helpers.readers import read
from helpers.training import TrainSetup

M = "llama-3.2-1b"
SETUPS = [
    dict(precision="bf16", lora_rank=16, seq=1024, batch=2),
    dict(precision="bf16", lora_rank=32, lora_targets="q,v", seq=768, batch=4),
    dict(precision="bf16", lora_rank=16, lora_dropout=0.05, seq=1024, batch=2),
    dict(precision="bf16", lora_rank=16, seq=1024, batch=2, checkpointing="full"),
    dict(precision="bf16", lora_rank=16, seq=1024, batch=2, base_weights="nf4"),
    dict(precision="bf16-mixed", lora_rank=16, seq=1024, batch=2, adapter_dtype="bf16"),
    dict(precision="bf16", lora_rank=16, seq=1024, batch=2, adapter_dtype="bf16"),
]


@pytest.mark.parametrize("kw", SETUPS, ids=["all-linear", "q,v", "dropout", "ckpt", "qlora", "mixed-bf16", "bf16"])
def test_dry_run_through_peft_agrees_with_the_estimate(kw, dry_agrees):
    """Every phase within 1% of a dry run of peft's own adapters (fp32 where peft's default puts them)."""
    dry_agrees(M, TrainSetup(**kw))


def test_peft_default_costs_an_fp32_copy_per_adapted_layer():
    """On a bf16 base without autocast, peft's fp32 adapters keep an fp32 copy of their input each: Llama-3.2-1B, all
    linears at rank 16, 2 x 1024 tokens: the dry run's forward grows by what the estimate says, about 1.8 GiB."""
    s = TrainSetup(precision="bf16", lora_rank=16, seq=1024, batch=2)
    assert s.adapters_fp32 and not s.replace(adapter_dtype="bf16").adapters_fp32
    d = {dt: dryrun.run(M, s.replace(adapter_dtype=dt), progress=False).gpu.phases["forward"] for dt in ("fp32", "bf16")}
    e = {dt: estimate.run(M, s.replace(adapter_dtype=dt)).gpu.phases["forward"] for dt in ("fp32", "bf16")}
    assert e["fp32"] - e["bf16"] == pytest.approx(d["fp32"] - d["bf16"], rel=0.02)
    assert 1.7 < (d["fp32"] - d["bf16"]) / 2**30 < 1.9


def test_scaled_run_through_peft_agrees_with_the_estimate(scaled_agrees):
    """The twin with peft's fp32 adapters on its bf16 base, trained for real on this CPU: every phase within 3%.
    (Without dropout: on a CPU torch's dropout keeps fp32 noise where CUDA keeps a bool mask, tests/test_lora_dropout.py.)"""
    r, e = scaled_agrees("llama-3-8b", TrainSetup(precision="bf16", lora_rank=8, batch=2, seq=128))
    assert e.train_setup.adapters_fp32 and r.gpu.breakdown["step"]["optimizer_states"] > 0


@pytest.mark.parametrize("kw,needle", [
    (dict(adapter_dtype="bf16"), "needs lora_rank"),
    (dict(adapter_dtype="fp16", lora_rank=8), "unknown adapter_dtype 'fp16': allowed are fp32, bf16"),
    (dict(adapter_dtype="fp32", lora_rank=8, strategy="zero2"), "modelled with strategies single and ddp, got 'zero2'"),
    (dict(adapter_dtype="bf16", lora_rank=8, precision="fp32"), "an fp32 base keeps its adapters in fp32"),
])
def test_bad_adapter_dtypes_are_one_line_errors(kw, needle):
    with pytest.raises(InputError) as err:
        TrainSetup(**kw).validate()
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_engines_keep_their_own_rule():
    """Without a value: fp32 on single and ddp; DeepSpeed's bf16 mode casts the adapters; FSDP2 keeps fp32 originals
    under its MixedPrecisionPolicy (bf16-mixed) only."""
    assert TrainSetup(lora_rank=8, precision="bf16", strategy="ddp", gpus=2).adapters_fp32
    assert not TrainSetup(lora_rank=8, strategy="zero2").adapters_fp32
    assert TrainSetup(lora_rank=8, strategy="fsdp2", gpus=2).adapters_fp32
    assert not TrainSetup(lora_rank=8, strategy="fsdp2", gpus=2, precision="bf16").adapters_fp32


def test_llamafactory_pure_bf16_keeps_bf16_adapters(tmp_path):
    """LLaMA-Factory casts trainable parameters to fp32 unless pure_bf16 (model/adapter.py)."""
    base = "model_name_or_path: meta-llama/Llama-3.2-1B\nfinetuning_type: lora\n"
    (tmp_path / "p.yaml").write_text(base + "pure_bf16: true\n")
    (tmp_path / "m.yaml").write_text(base + "bf16: true\n")
    pure, mixed = read([tmp_path / "p.yaml"]), read([tmp_path / "m.yaml"])
    assert pure.setup.adapter_dtype == "bf16" and not pure.setup.adapters_fp32
    assert any(d.key == "cast_trainable_params_to_fp32" and d.value is False for d in pure.defaults)
    assert mixed.setup.adapter_dtype is None and mixed.setup.adapters_fp32


def test_peft_published_reserve_needs_the_fp32_adapters():
    """Against a figure nobody here wrote (PEFT's MetaMathQA LoRA r32 run, peak reserved bytes on an L40S): the dry
    run's modelled reserve with peft's fp32 adapters lands within 2%; with bf16 adapters it is more than 7% under."""
    from helpers import published, published_runs

    row = published.peak("peft-metamathqa-llama3.2-3b-lora-r32")
    s = published_runs.setup(row)
    held = {dt: max(dryrun.run(row["model"], s.replace(adapter_dtype=dt), progress=False).gpu.reserved.values())
            for dt in ("fp32", "bf16")}
    assert abs(held["fp32"] / row["bytes"] - 1) < 0.02 and held["bf16"] / row["bytes"] - 1 < -0.07
