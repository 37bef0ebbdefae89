"""Keys and values expanded to every query head before the attention kernel (`kv_expanded`), as torchtune's and
LitGPT's own models do: the estimate against dry runs with the expansion re-enacted (the fake GPU's flash attention
on copies made as torchtune makes them; the copies are what CUDA's flash kernel saves for backward).

A scaled run cannot show it: on this CPU transformers' SDPA does take its repeat_kv branch under `kv_expanded`, but
the CPU kernel keeps the same bytes either way (the twin of Llama-3.2-1B, bf16, 4 x 256 tokens: a forward peak of
99,972,520 B grouped and expanded alike), so the check is the dry run's."""

import pytest

from helpers import estimate
from helpers.errors import InputError
from helpers.estimate.activations import expanded_kv_bytes
from helpers.models import spec
from helpers.training import TrainSetup

LORA = TrainSetup(precision="bf16", batch=2, seq=512, lora_rank=16, lora_targets="q_proj,v_proj", adapter_dtype="bf16",
                  attention="flash", kv_expanded=True)


def test_the_copies_per_token_per_layer():
    """Llama-3.2-1B: 32 query heads over 8 key/value heads of 64: (32 - 8) x 64 x 2 (keys, values) x 2 B."""
    assert expanded_kv_bytes(spec("llama-3.2-1b"), LORA) == 6144
    assert expanded_kv_bytes(spec("llama-3.2-1b"), LORA.replace(kv_expanded=False)) == 0
    assert expanded_kv_bytes(spec("llama-3.2-1b"), LORA.replace(attention="eager")) == 0   # eager repeats anyway
    assert expanded_kv_bytes(spec("phi-3-mini"), LORA.replace(lora_targets="qkv_proj")) == 0  # no grouped heads


def test_lora_bf16_dry_run_agrees_and_adds_the_copies(dry_agrees):
    d, e = dry_agrees("llama-3.2-1b", LORA)
    d0, e0 = dry_agrees("llama-3.2-1b", LORA.replace(kv_expanded=False))
    copies = 16 * 2 * 512 * 6144                                  # every layer's, at the end of forward
    assert e.gpu.phases["forward"] - e0.gpu.phases["forward"] == copies
    assert d.gpu.phases["forward"] - d0.gpu.phases["forward"] == pytest.approx(copies, rel=0.01)


def test_mixed_precision_sdpa_full_fine_tune_dry_run_agrees(dry_agrees):
    dry_agrees("qwen2.5-0.5b", TrainSetup(precision="bf16-mixed", batch=2, seq=512, kv_expanded=True))


@pytest.mark.parametrize("change, words", [
    (dict(checkpointing="selective"), "selective"),
    (dict(strategy="fsdp2", gpus=2, tensor_parallel=2), "tensor_parallel"),
])
def test_what_is_not_modelled_is_refused(change, words):
    with pytest.raises(InputError, match=words):
        estimate.run("llama-3.2-1b", TrainSetup(kv_expanded=True, **change))
