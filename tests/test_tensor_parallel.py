"""Tensor parallelism (torchtitan's plan) and context parallelism: validation, the per-rank parameter count against
torch's own sharding of the model on the meta device, how activations and logits scale, and the 2-D DTensor dry run
against the estimate."""

import argparse

import pytest
import torch

from helpers import estimate, models
from helpers.errors import InputError
from helpers.estimate import parallel
from helpers.measure import procgroup, tensor_parallel
from helpers.training import TrainSetup
from helpers.units import to_gib

FSDP = dict(strategy="fsdp2", gpus=8, gpus_per_node=8, seq=1024, precision="bf16", adam_impl="fused")


def _meta_model(name: str):
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(models.spec(name).path)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(cfg)


def _local_numel(p) -> int:
    return (p.to_local() if hasattr(p, "to_local") else p).numel()


@pytest.mark.parametrize("tp", [2, 8])
def test_parameters_per_rank_match_torch_sharding_on_the_meta_device(tp):
    """TP then FSDP2 over the other ranks, as torchtitan composes them: the estimate's per-rank parameter bytes equal
    the local shards torch makes, exactly."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    m = models.spec("llama-3-8b")
    procgroup.ensure("fake", 16)
    mesh = init_device_mesh("cpu", (16 // tp, tp), mesh_dim_names=("dp_shard_cp", "tp"))
    net = _meta_model("llama-3-8b")
    tensor_parallel.apply(net, mesh["tp"])
    assert sum(_local_numel(p) for p in net.parameters()) == parallel.rank_model(m, tp).params
    for layer in net.model.layers:
        fully_shard(layer, mesh=mesh["dp_shard_cp"])
    fully_shard(net, mesh=mesh["dp_shard_cp"])
    local_bytes = sum(_local_numel(p) * 2 for p in net.parameters())          # bf16
    e = estimate.run(m, TrainSetup(**{**FSDP, "gpus": 16}, tensor_parallel=tp))
    item = next(i for i in e.items if i["name"].startswith("sharded parameters"))
    assert item["bytes"] == local_bytes


def test_tensor_parallel_shards_weights_but_not_norms():
    m = models.spec("llama-3-8b")
    r = parallel.rank_model(m, 8)
    by_name = {t.name: t for t in r.tensors}
    assert by_name["model.layers.0.self_attn.q_proj.weight"].shape == (4096 // 8, 4096)
    assert by_name["model.layers.0.self_attn.o_proj.weight"].shape == (4096, 4096 // 8)
    assert by_name["model.layers.0.mlp.down_proj.weight"].shape == (4096, 14336 // 8)
    assert by_name["model.embed_tokens.weight"].shape == (128256 // 8, 4096)
    assert by_name["lm_head.weight"].shape == (128256 // 8, 4096)
    assert by_name["model.layers.0.input_layernorm.weight"].numel == 4096
    norms = sum(t.numel for t in m.tensors if t.ndim == 1)
    assert r.params == (m.params - norms) // 8 + norms


def _gpu(e, category, phase="forward"):
    return e.gpu.breakdown[phase][category]


def test_activations_and_logits_scale_with_tp_and_cp():
    m = models.spec("llama-3-8b")
    one = estimate.run(m, TrainSetup(**FSDP))
    tp8 = estimate.run(m, TrainSetup(**FSDP, tensor_parallel=8))
    cp4 = estimate.run(m, TrainSetup(**FSDP, context_parallel=4))
    both = estimate.run(m, TrainSetup(**FSDP, tensor_parallel=2, context_parallel=4))
    # loss parallel: 1/tp of the vocabulary; context parallel: 1/cp of the sequence
    assert _gpu(tp8, "logits") * 8 == _gpu(one, "logits")
    assert _gpu(cp4, "logits") * 4 == _gpu(one, "logits")
    # activations: everything 1/cp; under TP all but the all-gathered inputs of the colwise linears are 1/tp
    assert _gpu(cp4, "activations") * 4 == pytest.approx(_gpu(one, "activations"), rel=1e-3)
    a1, a8 = _gpu(one, "activations"), _gpu(tp8, "activations")
    gathered = 2 * 2 * 1024 * 4096 * m.layers + 2 * 1024 * 4096          # bf16, attention and MLP inputs, final norm
    assert a8 == pytest.approx((a1 - gathered) / 8 + gathered, rel=1e-3)
    assert _gpu(both, "activations") < _gpu(tp8, "activations")
    # parameters: 1/tp of the weights, FSDP over the remaining gpus / tp ranks: the same bytes per rank
    assert to_gib(_gpu(tp8, "parameters")) == pytest.approx(to_gib(_gpu(one, "parameters")), rel=1e-3)
    cp_note = next(i for i in cp4.items if "ring attention" in i["name"])
    assert "not measured" in cp_note["why"]


def test_torchtitan_70b_preset_is_expressible():
    """torchtitan's llama3_70b: 64 GPUs, TP 8 x FSDP 8, local batch 8, seq 8192, full activation checkpointing,
    loss parallel (pytorch/torchtitan train_configs/llama3_70b.toml at 238fa9953e4a)."""
    s = TrainSetup(strategy="fsdp2", gpus=64, tensor_parallel=8, batch=8, seq=8192, checkpointing="full")
    assert s.degrees.dp == 8
    e = estimate.run("llama-3.1-70b" if "llama-3.1-70b" in models.catalogue() else "llama-3-70b", s)
    assert 20 < to_gib(e.gpu.peak_bytes) < 80


@pytest.mark.parametrize("options, message", [
    (dict(strategy="fsdp2", gpus=6, tensor_parallel=4), r"gpus=6 must be a multiple of tensor_parallel x "
                                                        r"context_parallel = 4 x 1 = 4"),
    (dict(strategy="zero3", gpus=8, tensor_parallel=2), r"modelled with strategies ddp or fsdp2, got 'zero3'"),
    (dict(strategy="zero2", gpus=8, context_parallel=2), r"modelled with strategies ddp or fsdp2, got 'zero2'"),
    (dict(strategy="single", tensor_parallel=2), r"modelled with strategies ddp or fsdp2, got 'single'"),
    (dict(strategy="fsdp2", gpus=8, tensor_parallel=0), r"tensor_parallel must be a positive integer, got 0"),
    (dict(strategy="fsdp2", gpus=8, context_parallel=True), r"context_parallel must be a positive integer"),
    (dict(strategy="fsdp2", gpus=8, seq=100, context_parallel=4), r"seq=100 must be a multiple of 2 x context_parallel"),
])
def test_bad_degrees_are_refused_in_one_line(options, message):
    with pytest.raises(InputError, match=message) as err:
        TrainSetup(**options).validate()
    assert "\n" not in str(err.value)


def test_models_the_plan_cannot_take_are_refused():
    with pytest.raises(InputError, match=r"tensor_parallel=3 must divide llama-3-8b's attention heads \(32\)"):
        estimate.run("llama-3-8b", TrainSetup(strategy="fsdp2", gpus=6, tensor_parallel=3))
    with pytest.raises(InputError, match=r"mixture-of-experts"):
        estimate.run("mixtral-8x7b", TrainSetup(strategy="fsdp2", gpus=8, tensor_parallel=2))
    with pytest.raises(InputError, match=r"tied to the embedding"):
        estimate.run("llama-3.2-1b", TrainSetup(strategy="fsdp2", gpus=8, tensor_parallel=2))


def test_cli_and_explorer_take_tp_and_cp():
    from helpers import __main__ as cli
    from helpers import explore

    p = argparse.ArgumentParser()
    cli.setup_parser(p)
    a = p.parse_args(["--model", "llama-3-8b", "--strategy", "fsdp2", "--gpus", "16", "--tp", "4", "--cp", "2"])
    s = cli.setup_from_args(a)
    assert (s.tensor_parallel, s.context_parallel, s.degrees.dp) == (4, 2, 2)
    ex = explore.Explorer("llama-3-8b", TrainSetup(strategy="fsdp2", gpus=16, gpu_gib=80))
    ex.set(tensor_parallel=8)
    assert ex.setup.tensor_parallel == 8 and ex.setup_from_controls().degrees.dp == 2


def test_context_parallel_dry_run_says_why_not():
    from helpers.measure import dryrun

    with pytest.raises(InputError, match=r"context_parallel has no dry run here"):
        dryrun.run("llama-3-8b", TrainSetup(strategy="fsdp2", gpus=4, context_parallel=2, seq=256), progress=False)


@pytest.mark.parametrize("options", [
    dict(strategy="fsdp2", gpus=4, gpus_per_node=4, tensor_parallel=2, seq=256, adam_impl="fused"),
])
def test_dry_run_agrees_with_the_estimate_within_3_percent_per_phase(options):
    from helpers.bench import compare
    from helpers.measure import dryrun

    s = TrainSetup(**options)
    e, d = estimate.run("llama-3-8b", s, lifecycle=False), dryrun.run("llama-3-8b", s, progress=False)
    assert compare(e, d)[1] <= 0.03
    assert d.meta["engine"].startswith("FSDP2") and "tensor parallel" in d.meta["engine"]
