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


def _peft_net(cfg: dict, rank: int, targets: str, dropout: float = 0.0):
    """peft's get_peft_model on the tiny model: target_modules as given ("all-linear" the string; all-linear-names the
    list axolotl's find_all_linear_names builds; else the names as a list)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    net = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg))
    if targets == models.LINEAR_NAMES:        # axolotl loaders/adapter.py find_all_linear_names, as it is written
        modules = sorted({n.rsplit(".", 1)[-1] for n, mod in net.named_modules()
                          if isinstance(mod, torch.nn.Linear) or "Linear" in type(mod).__name__} - {"lm_head"})
    else:
        modules = targets if targets == "all-linear" else targets.split(",")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return get_peft_model(net, LoraConfig(r=rank, target_modules=modules, lora_dropout=dropout))


def _peft_adapters(cfg: dict, rank: int, targets: str = "all-linear") -> int:
    """Elements of every LoRA weight peft makes on the tiny model for `targets`."""
    return sum(p.numel() for n, p in _peft_net(cfg, rank, targets).named_parameters() if ".lora_" in n)


def _tiny(kind: str, tmp_path) -> models.ModelSpec:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY[kind]))
    return models.spec(str(path))


@pytest.mark.parametrize("kind", sorted(TINY))
def test_adapters_are_the_ones_peft_makes(kind, tmp_path):
    m = _tiny(kind, tmp_path)
    s = TrainSetup(lora_rank=4)
    ours = sum(t.numel for t in lora_adapters(m, 4, "all-linear", adapters.converted(m, s)).tensors)
    assert ours == _peft_adapters(TINY[kind], 4), kind
    assert adapters.experts_adapted(m, s) == (kind != "qwen2_moe")   # peft converts no qwen2_moe itself


# target lists as users write them: axolotl's lora_target_linear / LLaMA-Factory's all (every linear module's name,
# a list), the experts' transformers 4 names, one of them alone, and attention only
LISTS = {"mixtral": ("all-linear-names", "w1,w3,w2", "w2", "q_proj,v_proj", "q_proj,w1,w3", "q_proj,gate"),
         "qwen3_moe": ("all-linear-names", "gate_proj,up_proj,down_proj", "down_proj", "q_proj,v_proj"),
         "deepseek_v2": ("all-linear-names", "gate_proj,up_proj,down_proj", "down_proj", "q_proj,o_proj"),
         "qwen2_moe": ("all-linear-names", "gate_proj,up_proj,down_proj", "q_proj,v_proj")}


@pytest.mark.parametrize("kind,targets", [(k, t) for k in sorted(LISTS) for t in LISTS[k]])
def test_target_lists_adapt_what_peft_adapts(kind, targets, tmp_path):
    """A list naming the experts' transformers 4 names adapts the experts (and drops the linears of those names: a
    DeepSeek dense MLP, its shared experts), as the installed peft does it; a list of every linear name, as axolotl
    and LLaMA-Factory build it, adapts Mixtral's and Qwen3-MoE's attention only (their router and experts are no
    nn.Linear) but DeepSeek's experts too (its dense MLP's names are theirs)."""
    m = _tiny(kind, tmp_path)
    s = TrainSetup(lora_rank=4, lora_targets=targets)
    m.check_lora_rank(4, targets)
    ours = sum(t.numel for t in lora_adapters(m, 4, targets, adapters.converted(m, s)).tensors)
    assert ours == _peft_adapters(TINY[kind], 4, targets), (kind, targets)
    named = targets not in ("q_proj,v_proj", "q_proj,o_proj", "all-linear-names", "q_proj,gate")   # (gate: the router)
    experts = kind != "qwen2_moe" and (named or (kind, targets) == ("deepseek_v2", "all-linear-names"))
    assert adapters.experts_adapted(m, s) == experts


@pytest.mark.parametrize("kind,targets", [("mixtral", "all-linear-names"), ("deepseek_v2", "all-linear-names"),
                                          ("qwen3_moe", "down_proj"), ("mixtral", "w1,w3,w2"), ("mixtral", "q_proj,gate")])
def test_lora_dropout_on_target_lists_is_refused_where_peft_refuses_it(kind, targets, tmp_path):
    m = _tiny(kind, tmp_path)
    s = TrainSetup(lora_rank=4, lora_targets=targets, lora_dropout=0.05)
    try:
        _peft_net(TINY[kind], 4, targets, 0.05)
        peft_refuses = False
    except ValueError as e:
        peft_refuses = "lora_dropout" in str(e)
    try:
        adapters.check(m, s)
        ours = False
    except InputError as e:
        ours = "ParamWrapper" in str(e)
    assert ours == peft_refuses == (kind != "mixtral" or targets != "all-linear-names")


def test_qwen3_moe_all_linear_names_keeps_dropout(tmp_path):
    """Qwen3-MoE has no dense MLP: every linear name is attention's, so the list adapts no expert and dropout is fine."""
    m = _tiny("qwen3_moe", tmp_path)
    adapters.check(m, TrainSetup(lora_rank=4, lora_targets="all-linear-names", lora_dropout=0.05))
    _peft_net(TINY["qwen3_moe"], 4, "all-linear-names", 0.05)


def test_one_of_the_fused_pair_alone_is_refused_as_peft_refuses_it(tmp_path):
    m = _tiny("mixtral", tmp_path)
    with pytest.raises(ValueError, match="Cannot convert PEFT target"):
        _peft_net(TINY["mixtral"], 4, "q_proj,w1")
    with pytest.raises(InputError, match="refuses w1 without w3"):
        adapters.check(m, TrainSetup(lora_rank=4, lora_targets="q_proj,w1"))


def test_before_peft_0_19_the_experts_names_match_nothing():
    """peft 0.18: no conversion; a list naming only the experts' transformers 4 names finds no module (peft raises),
    one naming a linear too adapts that linear alone."""
    with pytest.raises(InputError, match="only from 0.19.0"):
        estimate.run("mixtral-8x7b", TrainSetup(lora_rank=16, lora_targets="w1,w2,w3", versions="peft=0.18.1"))
    old = estimate.run("mixtral-8x7b", TrainSetup(lora_rank=16, lora_targets="q,w1,w2,w3", versions="peft=0.18.1"))
    assert not any(i["name"].startswith("merged expert") for i in old.items)
    new = estimate.run("mixtral-8x7b", TrainSetup(lora_rank=16, lora_targets="q,w1,w2,w3"))
    assert any(i["name"].startswith("merged expert") for i in new.items)
    assert any(r["key"] == "peft_moe_names_converted" and not r["older"] for r in new.meta["versioned"])


def test_all_linear_on_peft_0_19_is_refused_as_it_fails():
    """peft 0.19.x converted an MoE's config but split the string 'all-linear' into characters (measured with peft
    0.19.1: 'Target modules {'l', 'r', 'n', '-', 'a', 'e', 'i'} not found'); 0.20.0 resolves it."""
    with pytest.raises(InputError, match="splits the string"):
        estimate.run("mixtral-8x7b", TrainSetup(lora_rank=16, versions="peft=0.19.1"))
    estimate.run("mixtral-8x7b", TrainSetup(lora_rank=16, versions="peft=0.18.1"))
    estimate.run("llama-3-8b", TrainSetup(lora_rank=16, versions="peft=0.19.1"))


def test_the_architectures_are_transformers_own_conversion_patterns():
    """models.PEFT_MOE_PATTERN is transformers 5.23.0's table, plus peft's own 'mixtral' entry: a newer transformers
    that maps more architectures shows here."""
    from transformers.conversion_mapping import _MODEL_TO_CONVERSION_PATTERN as table

    theirs = {k: v for k, v in table.items() if v in models.PEFT_MOE_NAMES} | {"mixtral": "mixtral"}
    assert models.PEFT_MOE_PATTERN == theirs


def test_the_names_are_peft_own_mapping():
    """models.PEFT_MOE_NAMES is the installed peft's _MOE_TARGET_MODULE_MAPPING (name -> the parameter it became)."""
    from peft.utils.transformers_weight_conversion import _MOE_FUSED_TARGETS, _MOE_TARGET_MODULE_MAPPING

    assert models.PEFT_MOE_NAMES == _MOE_TARGET_MODULE_MAPPING
    for pattern, fused in _MOE_FUSED_TARGETS.items():
        assert set(fused["gate_up_proj"]) == {n for n, new in models.PEFT_MOE_NAMES[pattern].items()
                                              if new == "gate_up_proj"}


def test_the_merged_expert_weights_are_what_the_recorded_dry_runs_hold():
    """The grid's rows with LoRA on an MoE's experts (dry runs of the real step: peft, transformers, torch;
    data/results): every phase within 3% of the dry run, and none under it by more than 16 MiB. (Attention-only
    adapters on an MoE merge no expert weight: tests/test_lora_fsdp1.py holds its FSDP1 row.)"""
    doc = json.loads((Path(__file__).resolve().parent.parent / "data" / "results" / "dryrun_vs_estimate.json").read_text())
    rows = [r for r in doc["rows"] if r["setup"]["lora_rank"] and models.spec(r["model"]).peft_expert_names()
            and adapters.experts_adapted(models.spec(r["model"]), TrainSetup(**r["setup"]))]
    assert len(rows) >= 3
    for r in rows:
        e = estimate.run(r["model"], TrainSetup(**r["setup"]), lifecycle=False)
        for phase, got in r["dry_run"]["gpu"]["phases"].items():
            want = e.gpu.phases[phase]
            assert abs(want - got) <= 0.03 * got and want >= got - 16 * 2**20, (r["model"], phase, want, got)


def test_a_dry_run_of_deepseek_lora_agrees():
    from helpers.measure import dryrun

    s = TrainSetup(lora_rank=8, seq=256)
    e, d = estimate.run("deepseek-v2-lite", s, lifecycle=False), dryrun.run("deepseek-v2-lite", s, progress=False)
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
