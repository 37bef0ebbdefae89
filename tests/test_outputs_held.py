"""A loop that keeps each micro batch's logits until the next forward returns (`outputs_held`: LitGPT's fit loop,
`logits = model(input_ids, ...)` rebound only by the next call): the logits live through backward, the step and the
next forward, and so does their graph's ctx state (bitsandbytes < 0.43.2 MatMul4Bit's kept inputs). The estimate
against dry runs whose loop holds the output the same way."""

import pytest

from helpers import estimate
from helpers.errors import InputError
from helpers.training import TrainSetup

QLORA_042 = TrainSetup(precision="bf16", batch=2, seq=512, lora_rank=32, lora_targets="q,v", lora_dropout=0.05,
                       adapter_dtype="bf16", attention="flash", grad_accum=2, base_weights="nf4",
                       versions="bitsandbytes=0.42.0", outputs_held=True)


@pytest.mark.parametrize("model, setup", [
    ("llama-3.2-1b", QLORA_042),
    ("llama-3.2-1b", QLORA_042.replace(base_weights=None, versions=None, kv_expanded=True)),
    ("qwen2.5-0.5b", TrainSetup(precision="bf16", batch=2, seq=512, attention="flash", outputs_held=True)),
])
def test_dry_run_agrees(dry_agrees, model, setup):
    dry_agrees(model, setup)


def test_what_holding_adds_matches_the_dry_run(dry_agrees):
    """Holding adds the logits (bf16, 2 x 512 x 128,256) and, with bitsandbytes 0.42.0, every 4-bit linear's input to
    the step; the dry runs with and without it differ by what the estimates differ by."""
    d, e = dry_agrees("llama-3.2-1b", QLORA_042)
    d0, e0 = dry_agrees("llama-3.2-1b", QLORA_042.replace(outputs_held=False))
    for phase in ("step", "steady"):
        added = e.gpu.phases[phase] - e0.gpu.phases[phase]
        assert added >= 2 * 512 * 128256 * 2
        assert d.gpu.phases[phase] - d0.gpu.phases[phase] == pytest.approx(added, rel=0.05), phase


def test_refused_where_not_modelled():
    with pytest.raises(InputError, match="outputs_held"):
        estimate.run("llama-3.2-1b", TrainSetup(outputs_held=True, strategy="fsdp2", gpus=2))
    with pytest.raises(InputError, match="outputs_held"):
        estimate.run("llama-3.2-1b", TrainSetup(outputs_held=True, fused_ce=True))
