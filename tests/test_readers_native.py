"""The torchtune and LitGPT readers against their own upstream configs (copies in tests/data/configs_upstream, sources
in its SOURCES.md), each reading written from the tool's source at the commit the reader names; a foreign file is
never read as another tool's (before these readers, both were taken as TRL files with TRL's defaults)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers.readers import ConfigError, detect, load, read

UP = Path(__file__).resolve().parent / "data" / "configs_upstream"
TT = UP / "torchtune" / "recipes" / "configs"
LG = UP / "litgpt" / "config_hub" / "finetune"
ROOT = Path(__file__).resolve().parents[1]

ALL_LINEAR = "q_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def reading(path: Path) -> dict:
    imp = read(path)
    s = imp.setup
    return {"format": imp.format, "model": imp.model, "strategy": s.strategy, "gpus": s.gpus, "batch": s.batch,
            "seq": s.seq, "grad_accum": s.grad_accum, "precision": s.precision, "lora_rank": s.lora_rank,
            "lora_targets": s.lora_targets if s.lora_rank else None, "lora_dropout": s.lora_dropout,
            "adapter_dtype": s.adapter_dtype, "base_weights": s.base_weights, "checkpointing": s.checkpointing,
            "optimizer": s.optimizer, "adam_impl": s.adam_impl, "offload": (s.offload_params, s.offload_optimizer),
            "not_modelled": {n.key for n in imp.not_modelled}}


# Each row: the file, then what torchtune's recipe does with it (recipes/*.py and the builders at bd2a0fc): dtype bf16
# is pure bf16; enable_activation_checkpointing wraps every layer; a file with a distributed recipe's keys runs FSDP2
# over tune run's ranks (1 unless --gpus), one without them runs on one GPU (a distributed recipe on one rank applies
# no FSDP either); qlora_ builders quantise the base (NF4);
# optimizer fused True -> fused, else torch's foreach; tokenizer.max_seq_len null -> 2048 assumed (said).
TORCHTUNE = [
    ("llama3_2/1B_lora_single_device.yaml",
     dict(model="llama-3.2-1b", strategy="single", batch=4, seq=2048, grad_accum=8, precision="bf16", lora_rank=64,
          lora_targets=ALL_LINEAR, lora_dropout=0.0, adapter_dtype="bf16", base_weights=None, checkpointing="none",
          optimizer="adamw", adam_impl="fused")),
    ("llama3_2/1B_qlora_single_device.yaml",
     dict(model="llama-3.2-1b", strategy="single", lora_rank=64, base_weights="nf4-dq", adapter_dtype="bf16")),
    ("llama3_1/8B_full.yaml",
     dict(model="llama-3.1-8b", strategy="fsdp2", gpus=1, batch=2, grad_accum=1, lora_rank=None,
          checkpointing="full", adam_impl="fused", offload=(False, False))),
    ("llama3_1/70B_full.yaml",
     dict(model="llama-3.1-70b", strategy="fsdp2", checkpointing="full", offload=(True, True))),
    ("llama3_1/8B_full_single_device.yaml",
     dict(model="llama-3.1-8b", strategy="single", optimizer="adamw-8bit", checkpointing="full")),
    ("qwen2_5/3B_lora.yaml",
     dict(model="qwen2.5-3b", strategy="single", lora_rank=8, lora_targets=ALL_LINEAR, adapter_dtype="bf16")),
    ("phi3/mini_lora_single_device.yaml",
     dict(model="phi-3-mini", lora_targets="qkv_proj,o_proj,gate_up_proj,down_proj", checkpointing="full")),
    ("gemma2/2B_qlora_single_device.yaml", dict(model="gemma-2-2b", base_weights="nf4-dq")),
    ("qwen3/8B_lora_single_device.yaml", dict(model="qwen3-8b", lora_rank=8)),
    ("llama3_2/1B_full.yaml", dict(model="llama-3.2-1b", strategy="single", lora_rank=None, grad_accum=8)),
]
TORCHTUNE_LISTED = {
    "llama3_2/1B_lora_single_device.yaml": {"loss._component_", "(torchtune's model)"},
    "llama3_1/8B_full_single_device.yaml": {"optimizer_in_bwd"},
    "llama3_1/8B_qat_lora.yaml": {"quantizer"},
    "llama3_2/8B_to_1B_KD_lora_single_device.yaml": {"teacher_model", "kd_loss"},
}

# LitGPT at 2685705: precision bf16-true is pure bf16 with bf16 adapters; quantize bnb.nf4 -> nf4 (no double
# quantisation); grad_accum = global_batch_size // devices // micro_batch_size; LoRA switches -> projections.
LITGPT = [
    ("llama-3.2-1B/lora.yaml",
     dict(model="llama-3.2-1b", strategy="single", batch=1, seq=512, grad_accum=8, precision="bf16", lora_rank=32,
          lora_targets="q_proj,v_proj", lora_dropout=0.05, adapter_dtype="bf16", base_weights=None,
          checkpointing="none", optimizer="adamw", adam_impl="foreach")),
    ("llama-3.2-1B/qlora.yaml",
     dict(model="llama-3.2-1b", batch=2, grad_accum=4, base_weights="nf4", lora_rank=32)),
    ("llama-3.2-1B/full.yaml", dict(model="llama-3.2-1b", lora_rank=None, batch=4, grad_accum=16)),
    ("llama-3.2-3B/qlora.yaml", dict(model="llama-3.2-3b", base_weights="nf4")),
    ("phi-3/lora.yaml", dict(model="phi-3-mini", lora_targets="qkv_proj,o_proj,gate_up_proj,down_proj")),
    ("tiny-llama/full.yaml", dict(model="tinyllama-1.1b", lora_rank=None)),
    ("gemma2-2b/qlora.yaml", dict(model="gemma-2-2b", lora_dropout=0.1, base_weights="nf4")),
    ("llama-3-8b/lora.yaml", dict(model="llama-3-8b", lora_rank=32)),
    # checkpoints/meta-llama/Meta-Llama-3.1-8B: the hub's name before Meta renamed it, as litgpt/config.py keeps it
    ("llama-3.1-8b/full.yaml", dict(model="llama-3.1-8b", strategy="fsdp1", gpus=4, batch=4, grad_accum=4,
                                    checkpointing="full", lora_rank=None)),
]


@pytest.mark.parametrize("name, expected", TORCHTUNE, ids=[r[0] for r in TORCHTUNE])
def test_torchtune_upstream_configs(name, expected):
    got = reading(TT / name)
    assert got["format"] == "torchtune"
    assert {k: got[k] for k in expected} == expected


@pytest.mark.parametrize("name, listed", TORCHTUNE_LISTED.items())
def test_torchtune_what_changes_memory_and_is_not_modelled_is_listed(name, listed):
    assert listed <= reading(TT / name)["not_modelled"]


@pytest.mark.parametrize("name, expected", LITGPT, ids=[r[0] for r in LITGPT])
def test_litgpt_upstream_configs(name, expected):
    got = reading(LG / name)
    assert got["format"] == "litgpt"
    assert {k: got[k] for k in expected} == expected


def test_litgpt_model_outside_the_catalogue_keeps_its_hub_id():
    imp = read(LG / "mistral-7b" / "lora.yaml")              # Mistral-7B-v0.1: not the catalogue's v0.3 shapes
    assert imp.model is None and imp.model_named == "mistralai/Mistral-7B-v0.1"


def test_both_tools_attention_keeps_keys_and_values_expanded():
    """torchtune's MultiHeadAttention and LitGPT's CausalSelfAttention expand k and v before SDPA: kv_expanded."""
    assert read(TT / "llama3_2/1B_lora_single_device.yaml").setup.kv_expanded
    assert read(LG / "llama-3.2-1B/qlora.yaml").setup.kv_expanded


def test_litgpt_fit_loop_holds_its_outputs_on_one_gpu(tmp_path):
    """litgpt/finetune/lora.py fit(): `logits` stays bound until the next forward returns (outputs_held); over
    several GPUs that is listed as not modelled, with its direction."""
    assert read(LG / "llama-3.2-1B/lora.yaml").setup.outputs_held
    assert not read(TT / "llama3_2/1B_lora_single_device.yaml").setup.outputs_held     # torchtune dels its logits
    f = tmp_path / "lora.yaml"
    f.write_text("checkpoint_dir: checkpoints/meta-llama/Llama-3.2-1B\nprecision: bf16-true\ndevices: 4\nlora_r: 8\n")
    imp = read(f)
    assert not imp.setup.outputs_held
    assert any("outputs_held): higher" in n.why for n in imp.not_modelled)


@pytest.mark.parametrize("path, fmt", [
    (TT / "llama3_2/1B_lora_single_device.yaml", "torchtune"), (LG / "llama-3.2-1B/qlora.yaml", "litgpt"),
    (UP / "trl/examples/cli_configs/example_config.yaml", "trl"),
    (UP / "llamafactory/examples/train_lora/qwen3_lora_sft.yaml", "llamafactory"),
])
def test_each_file_is_claimed_by_its_own_tool(path, fmt):
    assert detect(path, load(path)[0]) == fmt


@pytest.mark.parametrize("name, words", [
    ("llama3_2/evaluation.yaml", ("not a torchtune fine-tuning config",)),
    ("mistral/7B_full_ppo_low_memory.yaml", ("PPO", "not read")),
])
def test_torchtune_configs_of_other_recipes_are_refused(name, words):
    with pytest.raises(ConfigError) as e:
        read(TT / name)
    assert all(w in str(e.value) for w in words) and "\n" not in str(e.value)


LITGPT_MIN = "checkpoint_dir: checkpoints/meta-llama/Llama-3.2-1B\nprecision: {p}\n{extra}train:\n  micro_batch_size: 2\n"


@pytest.mark.parametrize("precision, extra, words", [
    ("bf16-mixed", "quantize: bnb.nf4\nlora_r: 8\n", ("mixed precision",)),
    ("bf16-true", "quantize: bnb.nf4\nlora_r: 8\ndevices: 2\n", ("more than one device",)),
    ("bf16-true", "quantize: bnb.q3\nlora_r: 8\n", ("quantize must be one of",)),
    ("fp8-true", "", ("precision must be one of",)),
    ("bf16-true", "lora_r: 8\nlora_query: false\nlora_value: false\n", ("adapts no layer",)),
    ("bf16-true", "train:\n  micro_batch_size: 4\n  global_batch_size: 2\n", ("global_batch_size",)),
])
def test_litgpt_what_litgpt_refuses_is_refused(tmp_path, precision, extra, words):
    text = LITGPT_MIN.format(p=precision, extra=extra)
    if extra.startswith("train:"):
        text = f"checkpoint_dir: checkpoints/meta-llama/Llama-3.2-1B\nprecision: {precision}\n{extra}"
    f = tmp_path / "run.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        read(f)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_litgpt_devices_choose_litgpt_engines(tmp_path):
    """finetune_lora over 4 GPUs: ModelParallelStrategy (FSDP2, every Block checkpointed); finetune_full: FSDP1."""
    f = tmp_path / "lora.yaml"
    f.write_text("checkpoint_dir: checkpoints/meta-llama/Llama-3.2-1B\nprecision: bf16-true\ndevices: 4\nlora_r: 8\n"
                 "train:\n  micro_batch_size: 1\n  global_batch_size: 16\n  max_seq_length: 1024\n")
    r = reading(f)
    assert (r["strategy"], r["gpus"], r["checkpointing"], r["grad_accum"], r["seq"]) == ("fsdp2", 4, "full", 4, 1024)
    g = tmp_path / "full.yaml"
    g.write_text(f.read_text().replace("lora_r: 8\n", ""))
    r = reading(g)
    assert (r["strategy"], r["lora_rank"]) == ("fsdp1", None)


TT_MIN = ("model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\n  lora_attn_modules: {modules}\n"
          "batch_size: 2\ngradient_accumulation_steps: 1\nresume_from_checkpoint: False\ndtype: {dtype}\n"
          "optimizer:\n  _component_: torch.optim.AdamW\n")


@pytest.mark.parametrize("modules, dtype, words", [
    ("[q_proj]", "fp16", ("dtype must be bf16 or fp32",)),
    ("[qkv]", "bf16", ("lora_attn_modules",)),
])
def test_torchtune_what_torchtune_refuses_is_refused(tmp_path, modules, dtype, words):
    f = tmp_path / "x_single_device.yaml"
    f.write_text(TT_MIN.format(modules=modules, dtype=dtype))
    with pytest.raises(ConfigError) as e:
        read(f)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_torchtune_minimal_file_reads(tmp_path):
    f = tmp_path / "x_single_device.yaml"
    f.write_text(TT_MIN.format(modules="[q_proj, v_proj]", dtype="bf16"))
    r = reading(f)
    assert (r["strategy"], r["lora_rank"], r["lora_targets"], r["checkpointing"]) == ("single", 8, "q_proj,v_proj",
                                                                                     "none")


def test_cli_estimates_a_torchtune_file_and_says_the_sequence_is_assumed():
    out = subprocess.run([sys.executable, "-m", "helpers", "estimate", "--from",
                          str(TT / "llama3_2/1B_lora_single_device.yaml"), "--offline"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "imported (torchtune)" in out.stdout and "pass --seq N" in out.stdout
    assert "needs:" in out.stdout


def test_torchtune_gpus_flag_runs_the_distributed_recipe():
    """A torchtune file with no distributed key on --gpus 4: FSDP2 (its distributed recipes), not the Trainer's DDP."""
    out = subprocess.run([sys.executable, "-m", "helpers", "estimate", "--from", str(TT / "llama3_2/1B_full.yaml"),
                          "--gpus", "4", "--offline"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "fsdp2 on 4 GPU(s)" in out.stdout


def test_torchtune_qlora_under_fsdp2_is_listed_not_dropped(tmp_path):
    f = tmp_path / "qlora.yaml"
    f.write_text(TT_MIN.format(modules="[q_proj, v_proj]", dtype="bf16").replace("lora_llama3_2_1b", "qlora_llama3_2_1b")
                 + "fsdp_cpu_offload: false\n")
    imp = read(f)
    assert imp.setup.strategy == "fsdp2" and imp.setup.base_weights is None
    assert any(n.key == "model._component_" and "4-bit" in n.why for n in imp.not_modelled)


@pytest.mark.parametrize("text, words", [
    ("enable_activation_checkpoint: true\n", ("'enable_activation_checkpoint'", "'enable_activation_checkpointing'")),
    ("", ("'lora_rnak'", "'lora_rank'")),
])
def test_torchtune_misspelt_keys_are_refused(tmp_path, text, words):
    body = TT_MIN.format(modules="[q_proj]", dtype="bf16") + text
    if not text:
        body = body.replace("  lora_attn_modules", "  lora_rnak: 64\n  lora_attn_modules")
    f = tmp_path / "x.yaml"
    f.write_text(body)
    with pytest.raises(ConfigError) as e:
        read(f)
    assert all(w in str(e.value) for w in words), str(e.value)


@pytest.mark.parametrize("extra, words", [
    ("lora_rnak: 64\n", ("'lora_rnak'", "'lora_r'")),
    ("train:\n  micro_batch: 2\n", ("train.'micro_batch'", "micro_batch_size")),
])
def test_litgpt_unknown_keys_are_refused_as_its_cli_does(tmp_path, extra, words):
    f = tmp_path / "run.yaml"
    f.write_text("checkpoint_dir: checkpoints/meta-llama/Llama-3.2-1B\nprecision: bf16-true\n" + extra)
    with pytest.raises(ConfigError) as e:
        read(f)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_litgpt_legacy_precision_and_a_missing_local_checkpoint(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("checkpoint_dir: /no/such/dir/my-llama\nprecision: bf16\nlora_r: 8\n")
    imp = read(f)
    assert imp.setup.precision == "bf16-mixed" and imp.model is None and imp.model_named == "/no/such/dir/my-llama"
    assert any(n.key == "precision" and "legacy" in n.why for n in imp.not_modelled)
