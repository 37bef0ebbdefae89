"""LoRA on "all-linear" of an MoE, as peft 0.20+ resolves it on transformers 5: the routed experts' 3-D weights and the
router are adapted too (ParamWrapper), and every forward of an MoE layer merges each expert weight with its delta and
keeps the merged weight for backward. Checked against peft itself (which weights it adapts, with what shapes), against
dry runs of the real step (the recorded grid and one run here), and for the versions before it."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from helpers import estimate, models, versions
from helpers.errors import InputError
from helpers.estimate import adapters
from helpers.estimate.states import lora_adapters
from helpers.training import TrainSetup

TINY = {
    "mixtral": dict(model_type="mixtral", architectures=["MixtralForCausalLM"], hidden_size=64, intermediate_size=96,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                    num_experts_per_tok=2, vocab_size=128, max_position_embeddings=256),
    "qwen3_moe": dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], hidden_size=64,
                      intermediate_size=160, moe_intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2, vocab_size=128,
                      max_position_embeddings=256),
    "deepseek_v2": dict(model_type="deepseek_v2", architectures=["DeepseekV2ForCausalLM"], hidden_size=64,
                        intermediate_size=160, moe_intermediate_size=96, num_hidden_layers=2, first_k_dense_replace=1,
                        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1,
                        num_experts_per_tok=2, vocab_size=128, kv_lora_rank=16, q_lora_rank=None,
                        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, max_position_embeddings=256),
    "qwen2_moe": dict(model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"], hidden_size=64,
                      intermediate_size=160, moe_intermediate_size=96, shared_expert_intermediate_size=112,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts=4,
                      num_experts_per_tok=2, vocab_size=128, max_position_embeddings=256),
}


def _peft_adapters(cfg: dict, rank: int) -> int:
    """Elements of every LoRA weight peft's get_peft_model(target_modules='all-linear') makes on the model."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = get_peft_model(AutoModelForCausalLM.from_config(config), LoraConfig(r=rank, target_modules="all-linear"))
    return sum(p.numel() for n, p in net.named_parameters() if ".lora_" in n)


@pytest.mark.parametrize("kind", sorted(TINY))
def test_adapters_are_the_ones_peft_makes(kind, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY[kind]))
    m = models.spec(str(path))
    s = TrainSetup(lora_rank=4)
    ours = sum(t.numel for t in lora_adapters(m, 4, "all-linear", adapters.experts_adapted(m, s)).tensors)
    assert ours == _peft_adapters(TINY[kind], 4), kind
    assert adapters.experts_adapted(m, s) == (kind != "qwen2_moe")   # peft converts no qwen2_moe itself


def test_the_architectures_are_transformers_own_conversion_patterns():
    """models.PEFT_MOE_PATTERN is transformers 5.23.0's table, plus peft's own 'mixtral' entry: a newer transformers
    that maps more architectures shows here."""
    from transformers.conversion_mapping import _MODEL_TO_CONVERSION_PATTERN as table

    theirs = {k: v for k, v in table.items() if v in models.PEFT_MOE_NAMES} | {"mixtral": "mixtral"}
    assert models.PEFT_MOE_PATTERN == theirs


def test_the_merged_expert_weights_are_what_the_recorded_dry_runs_hold():
    """The grid's LoRA-on-MoE rows (dry runs of the real step: peft, transformers, torch; data/results): every phase
    within 3% of the dry run, and none under it by more than 16 MiB."""
    doc = json.loads((Path(__file__).resolve().parent.parent / "data" / "results" / "dryrun_vs_estimate.json").read_text())
    rows = [r for r in doc["rows"] if r["setup"]["lora_rank"] and models.spec(r["model"]).peft_expert_names()]
    assert len(rows) >= 3
    for r in rows:
        e = estimate.run(r["model"], TrainSetup(**r["setup"]))
        for phase, got in r["dry_run"]["gpu"]["phases"].items():
            want = e.gpu.phases[phase]
            assert abs(want - got) <= 0.03 * got and want >= got - 16 * 2**20, (r["model"], phase, want, got)


def test_a_dry_run_of_deepseek_lora_agrees():
    from helpers.measure import dryrun

    s = TrainSetup(lora_rank=8, seq=256)
    e, d = estimate.run("deepseek-v2-lite", s), dryrun.run("deepseek-v2-lite", s, progress=False)
    merged = next(i for i in e.items if i["name"].startswith("merged expert weights"))
    assert merged["bytes"] > 0.4 * e.gpu.phases["forward"]                 # the merged weights dominate the forward
    for phase, got in d.gpu.phases.items():
        assert abs(e.gpu.phases[phase] - got) <= 0.03 * got, phase


def test_before_peft_0_20_the_experts_stay_frozen():
    new = estimate.run("mixtral-8x7b", TrainSetup(lora_rank=16, seq=256))
    old = estimate.run("mixtral-8x7b", TrainSetup(lora_rank=16, seq=256, versions="peft=0.18.1"))
    assert not any(i["name"].startswith("merged expert") for i in old.items)
    assert new.gpu.peak_bytes > 1.8 * old.gpu.peak_bytes                   # 179 GiB against 91
    rule = next(r for r in old.meta["versioned"] if r["key"] == "peft_moe_experts_adapted")
    assert rule["older"] and rule["version"] == "0.18.1"


def test_the_rule_is_listed_only_for_the_architectures_it_changes():
    dense = estimate.run("llama-3-8b", TrainSetup(lora_rank=16))
    assert not any(r["key"] == "peft_moe_experts_adapted" for r in dense.meta["versioned"])
    assert any(r["key"] == "peft_moe_experts_adapted" for r in versions.applied(TrainSetup(lora_rank=16)))


def test_lora_dropout_is_refused_where_peft_refuses_it():
    with pytest.raises(InputError, match="ParamWrapper"):
        estimate.run("qwen3-30b-a3b", TrainSetup(lora_rank=16, lora_dropout=0.05))
    estimate.run("qwen3-30b-a3b", TrainSetup(lora_rank=16, lora_dropout=0.05, lora_targets="q,k,v,o"))
    estimate.run("qwen1.5-moe-a2.7b", TrainSetup(lora_rank=16, lora_dropout=0.05))   # its experts stay frozen


def test_a_one_output_gate_does_not_bound_the_rank():
    """Qwen2-MoE's shared_expert_gate (1 x hidden) is a linear peft adapts at any rank; it bounded lora_rank at 1."""
    assert models.spec("qwen1.5-moe-a2.7b").max_lora_rank_for("all-linear") == 2048
    estimate.run("qwen1.5-moe-a2.7b", TrainSetup(lora_rank=16))
