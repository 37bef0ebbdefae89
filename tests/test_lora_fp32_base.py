"""LoRA on a float32 frozen base under 16-bit autocast (base_weights 'fp32'): what TRL trains by default (its
ModelConfig loads in float32, its SFTConfig turns bf16 autocast on). The frozen weights are fp32, and autocast casts
each of them afresh for its matmul (casts are cached for leaves that require grad only), the linear keeping the
16-bit copy for its input's gradient. The mechanism on torch itself, the estimate against dry runs of peft on that
base and a scaled run, the refusals, the TRL reader and the way out `fixes` offers."""

import pytest
import torch

from helpers import estimate
from helpers.errors import InputError
from helpers.measure import dryrun
from helpers.readers import read
from helpers.training import TrainSetup

M = "llama-3.2-1b"


@pytest.mark.parametrize("trainable", [False, True])
def test_autocast_keeps_a_fresh_copy_of_a_frozen_weight(trainable):
    """torch's autocast on this CPU: a frozen fp32 linear whose input needs a gradient saves a bf16 copy of its
    weight for backward, made anew by every call; a trainable weight's cast is cached and shared by the
    calls (aten/src/ATen/autocast_mode.h `cached_cast`)."""
    lin = torch.nn.Linear(64, 32, bias=False).requires_grad_(trainable)
    x = torch.randn(4, 64, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lin(x), lin(x)
    copies = [t for t in saved if t.shape == lin.weight.t().shape and t.dtype == torch.bfloat16]   # (its view W.t())
    assert len(copies) == 2
    distinct = len({t.untyped_storage().data_ptr() for t in copies})
    assert distinct == (1 if trainable else 2)


SETUPS = [
    dict(lora_rank=16, seq=512, batch=2),
    dict(lora_rank=16, seq=512, batch=2, checkpointing="full"),
    dict(lora_rank=16, seq=512, batch=2, lora_targets="q_proj,v_proj"),
    dict(lora_rank=16, seq=512, batch=2, lora_targets="gate_proj,up_proj,down_proj"),
    dict(lora_rank=16, seq=512, batch=2, precision="fp16-mixed", lora_dropout=0.05),
]


@pytest.mark.parametrize("kw", SETUPS, ids=["all-linear", "ckpt", "q,v", "mlp", "fp16-dropout"])
def test_dry_run_through_peft_on_an_fp32_base_agrees_with_the_estimate(kw, dry_agrees):
    """Every phase within 1% of a dry run of peft's adapters on the base loaded in float32, under autocast."""
    dry_agrees(M, TrainSetup(base_weights="fp32", **kw))


def test_the_fp32_base_nearly_doubles_the_peak():
    """Llama-3.2-1B, LoRA r16 on every linear, 2 x 512 tokens: the base's 4 bytes per weight and the 16-bit copies
    its linears keep take the dry run's peak from about 5.7 to about 10.3 GiB, and the estimate follows it."""
    s = TrainSetup(lora_rank=16, seq=512, batch=2)
    d = {bw: dryrun.run(M, s.replace(base_weights=bw), progress=False).gpu.peak_bytes for bw in (None, "fp32")}
    e = {bw: estimate.run(M, s.replace(base_weights=bw)).gpu.peak_bytes for bw in (None, "fp32")}
    assert e["fp32"] - e[None] == pytest.approx(d["fp32"] - d[None], rel=0.01)
    assert 5.5 < d[None] / 2**30 < 6 and 10 < d["fp32"] / 2**30 < 10.5
    names = {i["name"] for i in estimate.run(M, s.replace(base_weights="fp32")).items}
    assert "bf16 copies of the fp32 base's weights, saved by its linears" in names


def test_scaled_run_on_an_fp32_base_agrees_with_the_estimate(scaled_agrees):
    """The twin's base in float32 under bf16 autocast, trained for real on this CPU: every phase within 3%."""
    r, e = scaled_agrees("llama-3-8b", TrainSetup(lora_rank=8, base_weights="fp32", batch=2, seq=128))
    assert e.train_setup.base_fp32


@pytest.mark.parametrize("kw,needle", [
    (dict(base_weights="fp32"), "needs lora_rank"),
    (dict(base_weights="fp32", lora_rank=8, precision="bf16"), "precision bf16 computes in the weights' own dtype"),
    (dict(base_weights="fp32", lora_rank=8, precision="fp32"), "the base is fp32 already"),
    (dict(base_weights="fp32", lora_rank=8, strategy="zero2"), "the engine computes with its own 16-bit copies"),
    (dict(base_weights="fp32", lora_rank=8, adapter_dtype="bf16"), "peft gives adapters the base's dtype"),
    (dict(base_weights="fp8", lora_rank=8), "unknown base_weights 'fp8': allowed are fp32, nf4, nf4-dq"),
])
def test_bad_fp32_bases_are_one_line_errors(kw, needle):
    with pytest.raises(InputError) as err:
        TrainSetup(**kw).validate()
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_moe_on_an_fp32_base_is_refused():
    with pytest.raises(InputError, match="modelled for dense models without MLA"):
        estimate.run("qwen3-30b-a3b", TrainSetup(lora_rank=8, base_weights="fp32", seq=256))


def test_trl_reads_its_float32_default_as_an_fp32_base(tmp_path):
    """TRL's ModelConfig.dtype defaults to float32 (trl/trainer/model_config.py): with LoRA under bf16 on one GPU the
    set-up says base_weights=fp32; dtype bfloat16 trains a bf16 base; under ZeRO the fp32 base stays listed."""
    base = "model_name_or_path: meta-llama/Llama-3.2-1B\nuse_peft: true\nbf16: true\n"
    (tmp_path / "t.yaml").write_text(base)
    (tmp_path / "b.yaml").write_text(base + "dtype: bfloat16\n")
    default, bf16 = read([tmp_path / "t.yaml"]), read([tmp_path / "b.yaml"])
    assert default.setup.base_weights == "fp32" and bf16.setup.base_weights is None
    d = {x.key: x for x in default.defaults}["dtype"]
    assert d.value == "float32" and d.fields["base_weights"] == "fp32" and "base_weights=fp32" in d.sets
    assert not any(n.key == "dtype" for n in default.not_modelled)
    assert estimate.run(M, default.setup).gpu.peak_bytes > estimate.run(M, bf16.setup).gpu.peak_bytes


def test_fixes_offers_a_bf16_base():
    from helpers import fixes

    s = TrainSetup(lora_rank=16, base_weights="fp32", seq=2048, batch=4, gpu_gib=16)
    ways = {w.name: w for w in fixes.ways_out(M, s)}
    bf16 = ways["bf16 LoRA base (dtype bfloat16)"]
    assert bf16.change == {"base_weights": None} and bf16.peak_gib * 2**30 < estimate.run(M, s).gpu.peak_bytes
