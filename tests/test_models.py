"""The catalogue: exact parameter counts, and what an inventory knows."""

import json

import pytest

from helpers import models
from helpers.errors import InputError

EXACT = {
    "llama-3-8b": 8_030_261_248,
    "llama-2-7b": 6_738_415_616,          # the Llama 2 paper's and model card's "7B" (6.74B), LLaMA 1 7B's too
    "llama-2-13b": 13_015_864_320,        # the card's "13B" (13.0B), LLaMA 1 13B's too
    "llama-2-70b": 68_976_648_192,        # the card's "70B" (68.98B: GQA with 8 key-value heads)
    "llama-65b": 65_285_660_672,          # LLaMA 1 "65B" (the paper's 65.2B: 80 layers of dimension 8192)
    "llama-3.2-3b": 3_212_749_824,
    "qwen2.5-32b": 32_763_876_352,
    "qwen2.5-72b": 72_706_203_648,
}


@pytest.mark.parametrize("name,count", EXACT.items())
def test_exact_parameter_counts(name, count):
    assert models.spec(name).params == count


def test_catalogue_lists_the_original_five_among_its_models():
    assert set(EXACT) | {"deepseek-v2-lite"} <= set(models.catalogue())
    assert len(models.catalogue()) == 38


def test_tinyllama_count_matches_its_card_and_litgpt():
    """TinyLlama-1.1B (LitGPT's tiny-llama fine-tune configs start from it): 1.1B parameters per its model card; the
    exact count follows from the dimensions LitGPT's own config gives (litgpt/config.py, tiny-llama-1.1b: 22 layers,
    n_embd 2048, 32 heads in 4 query groups, intermediate 5632, vocab 32000, untied head)."""
    m = models.spec("TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T")
    assert m.name == "tinyllama-1.1b" and not m.tied
    assert (m.layers, m.hidden, m.intermediate, m.vocab, m.k_width) == (22, 2048, 5632, 32000, 4 * 64)
    assert m.params == 1_100_048_384 and round(m.params / 1e9, 1) == 1.1


def test_analytic_llama_count_matches_inventory():
    m = models.spec("llama-3-8b")
    h, i, L, V, kv = m.hidden, m.intermediate, m.layers, m.vocab, m.k_width
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h          # q,o + k,v + mlp + 2 norms
    assert m.params == L * per_layer + 2 * V * h + h
    assert m.group_params["layer.0"] == per_layer


def test_tied_embedding_counted_once():
    m = models.spec("llama-3.2-3b")
    assert m.tied and m.lm_head_params == 0
    assert m.group_params["embed"] == m.vocab * m.hidden


def test_deepseek_moe_dimensions():
    m = models.spec("deepseek-v2-lite")
    assert (m.moe_layers, m.experts, m.experts_active, m.expert_width) == (26, 64, 6, 1408)
    assert m.shared_width == 2 * 1408 and m.kv_latent == 512
    assert 15.6e9 < m.params < 15.8e9   # "15.7B" in DeepSeek's model card


def test_path_to_config_works(tmp_path):
    cfg = json.loads((models.MODELS_DIR / "llama-3-8b.json").read_text())
    cfg["num_hidden_layers"] = 2
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert models.spec(str(path)).layers == 2
    assert models.spec(str(tmp_path)).params == models.spec(str(path)).params   # a folder with config.json


@pytest.mark.parametrize("bad,needle", [
    ("llama-9000", "unknown model 'llama-9000'"),
    ("/no/such/config.json", "unknown model '/no/such/config.json'"),
])
def test_unknown_model_is_named(bad, needle):
    with pytest.raises(InputError, match="llama-3-8b") as e:
        models.spec(bad)
    assert needle in str(e.value)


def test_unreadable_and_non_decoder_configs(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(InputError, match="cannot read model config"):
        models.spec(str(broken))
    bert = tmp_path / "bert.json"
    bert.write_text(json.dumps({"model_type": "bert", "num_hidden_layers": 2, "hidden_size": 64,
                                "num_attention_heads": 2, "intermediate_size": 128, "vocab_size": 100}))
    with pytest.raises(InputError, match="not a decoder-only model"):
        models.spec(str(bert))
