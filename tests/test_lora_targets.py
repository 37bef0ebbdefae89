"""LoRA on a subset of the linear layers (--lora-targets): adapters counted exactly as peft makes them, bad targets
refused, and the estimate agreeing with the dry run and the scaled run (a frozen linear saves no input)."""

import pytest
import torch

from helpers import estimate, models
from helpers.__main__ import main
from helpers.errors import InputError
from helpers.measure import engines, scaled
from helpers.training import TrainSetup

M = "llama-3-8b"


@pytest.mark.parametrize("targets", ["q,v", "q_proj,k_proj,v_proj,o_proj", "gate,up,down", "all-linear"])
def test_adapter_count_is_peft_s(targets):
    twin = str(models.scaled_path(M))
    s = TrainSetup(lora_rank=8, lora_targets=targets, precision="bf16")
    net = engines.build_model(twin, s, torch.bfloat16, "sdpa")
    trainable = sum(p.numel() for p in net.parameters() if p.requires_grad)
    assert trainable == models.spec(twin).lora_params(8, targets) > 0


def test_litgpt_query_value_at_full_size():
    """q and v of Llama-3-8B at rank 16: 32 layers x 16 x ((4096 + 4096) + (4096 + 1024))."""
    assert models.spec(M).lora_params(16, "q,v") == 32 * 16 * (8192 + 5120)


@pytest.mark.parametrize("changes,needle", [
    (dict(lora_rank=8, lora_targets="q v"), "lora_targets must be all-linear, all-linear-names or linear module names"),
    (dict(lora_targets="q,v"), "lora_targets 'q,v' needs lora_rank"),
    (dict(lora_rank=8, lora_targets=["q_proj"]), "lora_targets must be all-linear"),
])
def test_bad_targets_are_refused(changes, needle):
    with pytest.raises(InputError, match=needle):
        TrainSetup(**changes).validate()


def test_a_target_the_model_does_not_have_is_named():
    """peft fails only when no target matches: a list where none does is refused; one where some do is estimated
    on those, and the others are said (a Llama list on DeepSeek's MLA attention)."""
    with pytest.raises(InputError, match=r"names qkv_proj, not a linear layer of llama-3-8b: .*q_proj"):
        estimate.run(M, TrainSetup(lora_rank=8, lora_targets="qkv_proj"))
    r = estimate.run(M, TrainSetup(lora_rank=8, lora_targets="q,qkv_proj"))
    assert r.meta["lora_unmatched"] == ["qkv_proj"]
    assert r.gpu.peak_bytes == estimate.run(M, TrainSetup(lora_rank=8, lora_targets="q")).gpu.peak_bytes
    from helpers import report

    assert "LoRA: qkv_proj match no module of llama-3-8b" in report.table(r)


def test_cli_takes_lora_targets(capsys):
    assert main(["estimate", "--model", "Qwen/Qwen3-4B", "--lora-rank", "16", "--lora-targets", "q,v",
                 "--seq", "512", "--json"]) == 0
    assert '"lora_targets": "q,v"' in capsys.readouterr().out
    assert main(["estimate", "--model", "qwen3-4b", "--lora-rank", "16", "--lora-targets", "qkv"]) == 2
    assert "error: lora_targets 'qkv' names qkv" in capsys.readouterr().err


def test_fewer_targets_fewer_bytes():
    runs = {t: estimate.run(M, TrainSetup(lora_rank=16, lora_targets=t, seq=2048)) for t in ("all-linear", "q,v")}
    assert runs["q,v"].gpu.peak_bytes < runs["all-linear"].gpu.peak_bytes


@pytest.mark.parametrize("targets", ["q,v", "q,k,v,o"])
def test_dry_run_agrees_with_the_estimate(targets, dry_agrees):
    dry_agrees(M, TrainSetup(precision="bf16-mixed", lora_rank=16, lora_targets=targets, seq=512), rel=0.03)


def test_scaled_run_agrees_with_the_estimate():
    setup = TrainSetup(precision="bf16-mixed", lora_rank=8, lora_targets="q,v", batch=2, seq=128)
    r = scaled.run(M, setup, steps=2, progress=False)
    twin, s = scaled.scaled_setup(M, setup)
    e = estimate.run(str(twin), s)
    for phase, measured in r.gpu.phases.items():
        assert e.gpu.phases[phase] == pytest.approx(measured, rel=0.03), phase
