"""Checkpointing every Nth decoder layer (--checkpoint-every N with --checkpointing full; torchtitan's layer-level
selective checkpointing, `selective_ac_option = "N"`): the layers it picks, its effect in the estimate counted
exactly, the estimate against the dry run (full size, fake tensors) and the real engines on the scaled twin within 3%
on every phase, and the option in the CLI, the explorer, the torchtitan reader, `fixes` and the step cost."""

import json

import pytest
from test_accumulation_checkpointing import worst_phase

from helpers import __main__ as cli
from helpers import estimate, explore, fixes, models, step_cost
from helpers.errors import InputError
from helpers.estimate import activations
from helpers.measure import checkpointing, dryrun, scaled
from helpers.training import TrainSetup

M = "llama-3.2-3b"          # 28 layers


@pytest.mark.parametrize("options, message", [
    (dict(checkpointing="full", checkpoint_every=0), "checkpoint_every must be a positive integer, got 0"),
    (dict(checkpointing="full", checkpoint_every=True), "checkpoint_every must be a positive integer, got True"),
    (dict(checkpointing="full", checkpoint_every=2000), "checkpoint_every must be at most 1,024, got 2,000"),
    (dict(checkpoint_every=2), "checkpoint_every 2 .* needs checkpointing 'full', got checkpointing 'none'"),
    (dict(checkpointing="selective", checkpoint_every=2), "needs checkpointing 'full', got checkpointing 'selective'"),
])
def test_bad_options_are_named(options, message):
    with pytest.raises(InputError, match=message):
        TrainSetup(**options).validate()


def test_the_layers_torchtitan_wraps_are_the_ones_checkpointed():
    """torchtitan counts the blocks from 1 and wraps those whose count is a multiple of N; transformers' layers each
    read their own flag."""
    from transformers import LlamaConfig, LlamaForCausalLM

    net = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=7,
                                       num_attention_heads=2, num_key_value_heads=2))
    checkpointing.enable(net, "full", 3)
    assert [layer.gradient_checkpointing for layer in net.model.layers] == [False, False, True, False, False, True,
                                                                           False]
    checkpointing.enable(net, "full", 1)
    assert all(layer.gradient_checkpointing for layer in net.model.layers)


def test_every_layer_is_full_checkpointing_and_more_layers_keep_more():
    full = estimate.run(M, TrainSetup(seq=2048, checkpointing="full"))
    assert estimate.run(M, TrainSetup(seq=2048, checkpointing="full", checkpoint_every=1)).gpu.phases == full.gpu.phases
    act = lambda n: estimate.run(M, TrainSetup(precision="bf16", seq=2048, checkpointing="full", checkpoint_every=n)
                                 ).gpu.breakdown["forward"]["activations"]
    none = estimate.run(M, TrainSetup(precision="bf16", seq=2048)).gpu.breakdown["forward"]["activations"]
    assert act(1) < act(2) < act(4) < act(7) < none


def test_saved_activations_counted_layer_by_layer():
    """Every 4th of 28 layers checkpointed: 7 keep their input (the bf16 residual stream, 2 x hidden per token),
    21 keep all they save without checkpointing; the final norm's saves come on top."""
    m = models.spec(M)
    s = TrainSetup(precision="bf16", seq=2048, checkpointing="full", checkpoint_every=4)
    T = s.batch * s.seq
    items = {i["name"]: i["bytes"] for i in estimate.run(M, s).items}
    assert items["inputs of the 7 checkpointed layers (every 4th)"] == 7 * 2 * T * m.hidden
    assert items["saved activations of the 21 layers not checkpointed"] == \
        21 * activations.layer_bytes(m, s, moe=False) + activations.norm_bytes(m, s, 1) * T
    # 28 is a multiple of 4: the last layer is checkpointed and recomputed first in backward
    assert items["the last layer recomputed while every other layer's activations are kept"] == \
        activations.layer_bytes(m, s, moe=False) - 2 * T * m.hidden


@pytest.mark.parametrize("model, setup", [
    ("llama-3.2-1b", TrainSetup(precision="bf16", adam_impl="fused", batch=4, seq=4096, checkpointing="full",
                                checkpoint_every=2, fused_ce=True, attention="flash")),
    ("llama-3.2-1b", TrainSetup(precision="bf16-mixed", adam_impl="fused", batch=2, seq=1024, checkpointing="full",
                                checkpoint_every=4)),
    ("llama-3.2-1b", TrainSetup(strategy="zero2", gpus=4, batch=2, seq=2048, checkpointing="full",
                                checkpoint_every=2)),
    ("llama-3-8b", TrainSetup(strategy="fsdp2", gpus=2, gpus_per_node=2, seq=1024, checkpointing="full",
                              checkpoint_every=3)),
    ("deepseek-v2-lite", TrainSetup(precision="bf16", adam_impl="fused", seq=1024, checkpointing="full",
                                    checkpoint_every=3)),
    ("gemma-3-1b", TrainSetup(precision="bf16", adam_impl="fused", batch=2, seq=2048, checkpointing="full",
                              checkpoint_every=2)),
])
def test_estimate_agrees_with_the_dry_run(model, setup):
    assert worst_phase(estimate.run(model, setup, lifecycle=False), dryrun.run(model, setup, progress=False)) < 0.03


@pytest.mark.parametrize("setup", [
    TrainSetup(precision="bf16", adam_impl="fused", batch=2, seq=256, checkpointing="full", checkpoint_every=2),
    TrainSetup(strategy="zero2", batch=2, seq=128, checkpointing="full", checkpoint_every=2),
])
def test_estimate_agrees_with_the_real_engine_on_the_twin(setup):
    r = scaled.run("llama-3-8b", setup, steps=2, progress=False)
    twin, s = scaled.scaled_setup("llama-3-8b", setup)
    assert r.setup["checkpoint_every"] == 2 and r.meta["losses"][-1] < r.meta["losses"][0]
    assert worst_phase(estimate.run(str(twin), s, lifecycle=False), r) < 0.03


def test_cli_explorer_and_readers_take_it(capsys, tmp_path):
    assert cli.main(["estimate", "--model", M, "--checkpointing", "full", "--checkpoint-every", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["setup"]["checkpoint_every"] == 2
    assert cli.main(["estimate", "--model", M, "--checkpoint-every", "2"]) == 2
    assert "needs checkpointing 'full'" in capsys.readouterr().err
    toml = tmp_path / "llama3_8b.toml"      # torchtitan's default option: every 2nd layer
    toml.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nseq_len = 2048\nlocal_batch_size = 1\n'
                    '[activation_checkpoint]\nmode = "selective"\n')
    assert cli.main(["estimate", "--from", str(toml), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["setup"]
    assert (out["checkpointing"], out["checkpoint_every"]) == ("full", 2)
    assert cli.main(["estimate", "--from", str(toml), "--checkpointing", "none", "--json"]) == 0   # a flag overrides
    assert json.loads(capsys.readouterr().out)["setup"]["checkpoint_every"] == 1
    ex = explore.Explorer(M, TrainSetup(gpu_gib=80))
    ex.set(checkpointing="full", checkpoint_every=4)
    assert (ex.setup.checkpointing, ex.setup.checkpoint_every, ex.error) == ("full", 4, None)
    ex.set(checkpointing="none")
    assert (ex.setup.checkpointing, ex.setup.checkpoint_every, ex.error) == ("none", 1, None)


def test_fixes_and_step_cost_know_it():
    s = TrainSetup(precision="bf16", seq=8192, checkpointing="full", checkpoint_every=2, gpu_gib=24)
    names = [w.name for w in fixes.ways_out(M, s)]
    assert "checkpointing every layer" in names and "checkpointing selective" in names
    every = TrainSetup(seq=2048, checkpointing="full", checkpoint_every=2)
    assert step_cost.recompute_flops(M, every) == step_cost.recompute_flops(M, TrainSetup(seq=2048, checkpointing="full")) / 2
