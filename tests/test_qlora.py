"""QLoRA (base_weights 'nf4', 'nf4-dq'): the 4-bit base's bytes exactly as bitsandbytes makes them on this CPU, with
and without double quantisation, the estimate against a dry run and scaled runs through bitsandbytes itself, the 4-bit
matmul of bitsandbytes before 0.43.2 (`versions`), refused combinations, the CLI flag and the explorer."""

import json
import math

import pytest
import torch

from helpers import estimate, explore, models
from helpers.__main__ import main
from helpers.errors import InputError
from helpers.estimate import quantized
from helpers.measure import engines, nf4, scaled
from helpers.training import TrainSetup

M = "llama-3-8b"
QLORA = TrainSetup(lora_rank=8, base_weights="nf4", precision="bf16", batch=2, seq=128)


def _bytes(tensors) -> int:
    """Bytes of distinct storages."""
    seen, total = set(), 0
    for t in tensors:
        st = t.untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            total += st.nbytes()
    return total


@pytest.mark.parametrize("double", [True, False], ids=["nf4-dq", "nf4"])
@pytest.mark.parametrize("out_f,in_f", [(512, 256), (30, 100), (7, 9), (1000, 333)])
def test_one_weight_is_bitsandbytes_own(out_f, in_f, double):
    """Codes and the NF4 code book with the fp32 absmax (nf4), or with the 8-bit absmax, second-level absmax, offset
    and its code book (nf4-dq), as bitsandbytes quantises a Linear4bit here (including sizes that are not multiples
    of its blocks)."""
    import bitsandbytes as bnb

    lin = torch.nn.Sequential(torch.nn.Linear(in_f, out_f, bias=False, dtype=torch.bfloat16))
    lin.get_output_embeddings = lambda: None
    nf4.quantize(lin, double=double)
    q = lin[0]
    assert isinstance(q, bnb.nn.Linear4bit) and q.weight.quant_state.blocksize == 64
    assert q.weight.quant_state.nested == double and q.weight.quant_state.quant_type == "nf4"
    if double:
        assert q.weight.quant_state.state2.blocksize == 256
    else:
        assert q.weight.quant_state.absmax.dtype == torch.float32
    assert _bytes([q.weight] + nf4.state_tensors(lin)) == quantized.nf4_weight_bytes(out_f * in_f, double)


@pytest.mark.parametrize("weights", ["nf4", "nf4-dq"])
def test_the_twins_base_is_counted_exactly(weights):
    """Every tensor of the quantised twin (peft adapters on it): the 4-bit weights and their state, the bf16
    embedding, norms and head, and the adapters, against the estimate's counts."""
    twin = str(models.scaled_path(M))
    m = models.spec(twin)
    setup = QLORA.replace(base_weights=weights)
    net = engines.build_model(twin, setup, torch.bfloat16, "sdpa")
    codes, rest = quantized.nf4_base_bytes(m, setup.double_quant)
    four_bit = [p for p in net.parameters() if hasattr(p, "quant_state")]
    assert len(four_bit) == len(quantized.nf4_tensors(m)) == 7 * m.layers
    assert _bytes(four_bit + nf4.state_tensors(net)) == codes
    frozen = [p for p in net.parameters() if not p.requires_grad and not hasattr(p, "quant_state")]
    assert _bytes(frozen) == 2 * rest
    assert sum(p.numel() for p in net.parameters() if p.requires_grad) == m.lora_params(8)


def test_full_size_base_is_about_a_quarter():
    """Llama-3-8B: the linear layers in 4 bits (0.5 + 4/64 bytes a weight and 64 bytes each; with double quantisation
    0.5 + 1/64 + 4/(64*256) and 1,092 bytes each), the embedding and head in bf16; its base in GiB against the bf16
    LoRA base."""
    m = models.spec(M)
    linear = sum(t.numel for t in quantized.nf4_tensors(m))
    assert linear == 6_979_321_856
    b = estimate.run(M, TrainSetup(lora_rank=16, seq=512))
    adapters = 4 * m.lora_params(16)           # fp32 adapters under torch's bf16-mixed
    assert b.gpu.breakdown["setup"]["parameters"] - adapters == 2 * m.params
    bases = {}
    for weights, double in (("nf4", False), ("nf4-dq", True)):
        q = estimate.run(M, TrainSetup(lora_rank=16, base_weights=weights, seq=512))
        bases[weights] = q.gpu.breakdown["setup"]["parameters"] - adapters
        assert bases[weights] == quantized.nf4_base_bytes(m, double)[0] + 2 * (m.params - linear)
        assert q.gpu.peak_bytes < b.gpu.peak_bytes - 9 * 2**30
    assert round(bases["nf4-dq"] / 2**30, 2) == 5.31 and round(bases["nf4"] / 2**30, 2) == 5.61   # as the README says
    assert bases["nf4"] - bases["nf4-dq"] == len(quantized.nf4_tensors(m)) * (64 - 1092) + sum(
        3 * math.ceil(t.numel / 64) - 4 * math.ceil(t.numel / 64 / 256) for t in quantized.nf4_tensors(m))


@pytest.mark.parametrize("setup", [
    QLORA,
    TrainSetup(lora_rank=8, base_weights="nf4", batch=2, seq=128),
    TrainSetup(lora_rank=8, base_weights="nf4", precision="bf16", batch=2, seq=128, grad_checkpointing=True),
], ids=["bf16", "bf16-mixed", "bf16-ckpt"])
def test_scaled_run_through_bitsandbytes_agrees_with_the_estimate(setup):
    """The twin quantised by bitsandbytes and trained for real on this CPU (its default 4-bit matmul: dequantise,
    then multiply), every phase within 3% of the estimate."""
    r = scaled.run(M, setup, steps=2, progress=False)
    twin, s = scaled.scaled_setup(M, setup)
    e = estimate.run(str(twin), s)
    assert r.meta["losses"][-1] < r.meta["losses"][0]
    for phase, measured in r.gpu.phases.items():
        assert e.gpu.phases[phase] == pytest.approx(measured, rel=0.03), phase
    assert r.gpu.breakdown["step"]["optimizer_states"] <= 8 * models.spec(str(twin)).lora_params(8)


@pytest.mark.parametrize("setup", [
    TrainSetup(strategy="zero2", lora_rank=8, base_weights="nf4", batch=2, seq=128),
    TrainSetup(strategy="zero1", lora_rank=8, base_weights="nf4-dq", batch=2, seq=128, checkpointing="full",
               offload_optimizer=True),
], ids=["zero2", "zero1-offload-ckpt"])
def test_scaled_run_under_deepspeed_agrees_with_the_estimate(setup):
    """QLoRA under ZeRO-1/2 (axolotl's and LLaMA-Factory's usual multi-GPU QLoRA): the twin's 4-bit base trained for
    real through DeepSpeed's engine (bitsandbytes' Params4bit is no floating tensor, so DeepSpeed's bf16 cast leaves
    it, and ZeRO-1/2 never partition parameters): the base is on every rank whole, and only the adapters' gradients
    and states are DeepSpeed's. Every phase within 2%; the parameters within 4 KiB (2,176 bytes under on this twin,
    as under DDP: a gap of the 4-bit base's count, not of DeepSpeed)."""
    r = scaled.run(M, setup, steps=2, progress=False)
    twin, s = scaled.scaled_setup(M, setup)
    e = estimate.run(str(twin), s)
    assert r.meta["engine"].startswith("DeepSpeed") and r.meta["losses"][-1] < r.meta["losses"][0]
    for phase, measured in r.gpu.phases.items():
        assert e.gpu.phases[phase] == pytest.approx(measured, rel=0.02), phase
        assert e.gpu.phases[phase] >= measured - 16 * 2**10, phase
    assert e.gpu.breakdown["setup"]["parameters"] == pytest.approx(r.gpu.breakdown["setup"]["parameters"], abs=4096)


def test_fp32_compute_changes_the_base_by_the_4bit_weights_alone():
    """precision 'fp32' (bnb_4bit_compute_dtype fp32, LLaMA-Factory's default without bf16): the twin with a 4-bit
    base against the same twin with an fp32 LoRA base, both trained for real: the 4-bit base saves what the estimate
    says it saves, to the byte in every phase but a few KiB of buffers. (The fp32 LoRA activations themselves are
    estimated ~3.1% high on this twin with or without the 4-bit base: a gap of the LoRA model, not of QLoRA.)"""
    runs, ests = {}, {}
    for bw in (None, "nf4"):
        setup = TrainSetup(lora_rank=8, base_weights=bw, precision="fp32", batch=2, seq=128)
        runs[bw] = scaled.run(M, setup, steps=2, progress=False)
        twin, s = scaled.scaled_setup(M, setup)
        ests[bw] = estimate.run(str(twin), s)
    for phase in runs["nf4"].gpu.phases:
        measured = runs[None].gpu.phases[phase] - runs["nf4"].gpu.phases[phase]
        estimated = ests[None].gpu.phases[phase] - ests["nf4"].gpu.phases[phase]
        assert estimated == pytest.approx(measured, abs=8192), phase
        assert ests["nf4"].gpu.phases[phase] == pytest.approx(runs["nf4"].gpu.phases[phase], rel=0.04), phase


@pytest.mark.parametrize("changes,needle", [
    (dict(base_weights="nf4"), "base_weights 'nf4' (how LoRA's frozen base is stored) needs lora_rank"),
    (dict(base_weights="int4", lora_rank=8), "unknown base_weights 'int4': allowed are fp32, nf4, nf4-dq"),
    (dict(base_weights="nf4", lora_rank=8, strategy="zero3"), "modelled with strategies single, ddp, zero1 and zero2, "
                                                               "got 'zero3'"),
    (dict(base_weights="nf4", lora_rank=8, strategy="fsdp2"), "got 'fsdp2'"),
    (dict(base_weights="nf4", lora_rank=8, strategy="ddp", gpus=2, tensor_parallel=2), "without tensor or context"),
])
def test_bad_combinations_are_one_line_errors(changes, needle):
    with pytest.raises(InputError) as err:
        TrainSetup(**changes).validate()
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_dry_run_agrees_with_the_estimate_at_full_size(dry_agrees):
    """Llama-3.2-1B quantised by bitsandbytes' own quantize_4bit on fake tensors and stepped with its default 4-bit
    matmul: every phase within 3% of the estimate, and the 4-bit base's bytes the same to within the buffers."""
    s = TrainSetup(lora_rank=16, base_weights="nf4", precision="bf16", seq=1024)
    d, e = dry_agrees("llama-3.2-1b", s, rel=0.03)
    assert d.gpu.breakdown["setup"]["parameters"] == pytest.approx(e.gpu.breakdown["setup"]["parameters"], abs=2**20)


def test_cli_takes_base_weights(capsys):
    assert main(["estimate", "--model", M, "--lora-rank", "16", "--base-weights", "nf4", "--seq", "512",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["setup"]["base_weights"] == "nf4"
    assert any("4-bit NF4" in i["name"] for i in out["items"])
    assert main(["estimate", "--model", M, "--base-weights", "nf4"]) == 2
    assert "needs lora_rank" in capsys.readouterr().err
    assert main(["estimate", "--model", M, "--lora-rank", "8", "--base-weights", "nf8"]) == 2
    assert "error: unknown base_weights 'nf8'" in capsys.readouterr().err


def test_explorer_has_the_control():
    ex = explore.Explorer(M, TrainSetup(gpu_gib=80, lora_rank=16))
    before = ex.result.gpu.peak_bytes
    ex.set(base_weights="nf4")
    assert ex.setup.base_weights == "nf4" and ex.error is None and ex.result.gpu.peak_bytes < before
    ex.set(lora_rank=0)
    assert ex.setup.base_weights is None          # no LoRA, no 4-bit base


def test_moe_experts_stay_in_the_compute_dtype_under_a_4bit_base(tmp_path):
    """transformers 5 fuses an MoE's experts into 3-D parameters, which its bitsandbytes integration (nn.Linear only)
    does not quantise: a tiny Mixtral loaded in 4 bits keeps them in bf16, and so does the estimate (Mixtral-8x7B's
    4-bit base is 85 GiB, not 24)."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, MixtralConfig

    cfg = MixtralConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    net = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16, quantization_config=BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16))
    kinds = {n.rsplit(".", 1)[-1]: (type(p).__name__, p.dtype) for n, p in net.named_parameters() if ".layers.0." in n}
    assert kinds["gate_up_proj"] == kinds["down_proj"] == ("Parameter", torch.bfloat16)
    assert kinds["weight"][0] in ("Params4bit", "Parameter")           # (the last weight named: a norm)
    assert any(type(p).__name__ == "Params4bit" for p in net.parameters())
    r = estimate.run("mixtral-8x7b", TrainSetup(lora_rank=8, base_weights="nf4-dq", seq=256))
    experts = sum(t.numel for t in models.spec("mixtral-8x7b").tensors if t.ndim == 3)
    rest = next(i for i in r.items if i["name"].startswith("frozen base: embedding"))
    assert "MoE experts" in rest["name"] and rest["bytes"] >= 2 * experts
    four = next(i for i in r.items if i["name"].startswith("frozen base: 4-bit"))
    assert (round((four["bytes"] + rest["bytes"]) / 2**30, 1), round(four["bytes"] / 2**30, 1),
            round(rest["bytes"] / 2**30, 1)) == (85.1, 0.6, 84.5)                 # as the README says
    assert any(v["key"] == "moe_experts_fused" for v in r.meta["versioned"])


def test_transformers_4_moe_is_refused():
    with pytest.raises(InputError, match="before 5.0 each routed expert is its own nn.Linear"):
        estimate.run("mixtral-8x7b", TrainSetup(lora_rank=8, base_weights="nf4", versions="transformers=4.57.1"))
    estimate.run("llama-3-8b", TrainSetup(lora_rank=8, base_weights="nf4", versions="transformers=4.57.1"))
