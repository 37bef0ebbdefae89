"""FSDP1 (FullyShardedDataParallel, FULL_SHARD) as a strategy: its memory items against exact counts of a meta-device
model, its dry run on a fake process group against the estimate, its scaled run under torchrun, the CLI, the Python
API and the explorer offering it, and one-line refusals of what it does not take."""

import json
import math

import pytest
import torch

from helpers import estimate, models, strategies
from helpers.__main__ import main
from helpers.errors import InputError
from helpers.measure import dryrun, scaled
from helpers.training import TrainSetup

BUFFERS_FLOOR = 8 * 2**10       # a twin's GPU phase holding only the model's buffers (rotary inv_freq): not modelled


def units_on_meta(name: str) -> tuple[int, list[int]]:
    """(root unit's parameters, each decoder layer's) counted on the model itself, built on the meta device: what
    transformer_auto_wrap_policy puts in each FlatParameter (a tied weight counted once)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        net = AutoModelForCausalLM.from_config(models.load_config(models.spec(name).path))
    layers = [sum(p.numel() for p in layer.parameters()) for layer in net.model.layers]
    return sum(p.numel() for p in net.parameters()) - sum(layers), layers


def item(result, start: str) -> dict:
    return next(i for i in result.items if i["name"].startswith(start))


@pytest.mark.parametrize("name, gpus", [("llama-3-8b", 8), ("llama-3.2-1b", 3)])
def test_items_match_the_flat_parameters_of_a_meta_model(name, gpus):
    root, layers = units_on_meta(name)
    e = estimate.run(name, TrainSetup(strategy="fsdp1", gpus=gpus, seq=256))
    shard = lambda n: math.ceil(n / gpus)
    units = [root] + layers
    assert item(e, "sharded flat parameters")["bytes"] == sum(shard(n) for n in units) * 4           # fp32 shards
    assert item(e, "unsharded root unit")["bytes"] == shard(root) * gpus * 2                          # bf16, padded
    assert item(e, "lazy initialisation")["bytes"] == max(shard(n) * gpus for n in units) * 4
    assert item(e, "AdamW exp_avg + exp_avg_sq")["bytes"] == 2 * sum(shard(n) for n in units) * 4
    layer_grads = item(e, "sharded gradients (fp32) of the layers")["bytes"]
    assert layer_grads + item(e, "sharded gradient of the root unit")["bytes"] == sum(shard(n) for n in units) * 4


def test_offload_puts_shards_gradients_and_states_on_the_host():
    s = TrainSetup(strategy="fsdp1", gpus=8, seq=256, offload_optimizer=True, offload_params=True)
    e = estimate.run("llama-3-8b", s, lifecycle=False)
    on_host = {i["category"] for i in e.items if i["device"] == "host" and i["category"] != "pinned_overhead"}
    assert on_host == {"parameters", "gradients", "optimizer_states", "temporaries"}
    assert not any(i["device"] == "gpu" and i["category"] in ("optimizer_states",) for i in e.items)
    assert e.gpu.peak_bytes < estimate.run("llama-3-8b", s.replace(offload_optimizer=False, offload_params=False)).gpu.peak_bytes


@pytest.mark.parametrize("options", [dict(seq=128, adam_impl="fused"), dict(seq=256, grad_accum=2)])
def test_dry_run_agrees_with_the_estimate_on_every_phase(options):
    s = TrainSetup(strategy="fsdp1", gpus=2, gpus_per_node=2, **options)
    d, e = dryrun.run("llama-3.2-1b", s, progress=False), estimate.run("llama-3.2-1b", s, lifecycle=False)
    assert "FSDP1" in d.meta["engine"]
    for phase, got in d.gpu.phases.items():
        assert e.gpu.phases[phase] == pytest.approx(got, rel=0.03), phase
    # the flat shards exactly; beside them the model's buffers (rotary inv_freq), which the estimate leaves out
    assert d.gpu.breakdown["setup"]["parameters"] == pytest.approx(item(e, "sharded flat parameters")["bytes"],
                                                                   abs=BUFFERS_FLOOR)


def test_scaled_run_with_cpu_offload_under_torchrun():
    s = TrainSetup(strategy="fsdp1", gpus=2, gpus_per_node=2, batch=2, seq=64, offload_optimizer=True,
                   offload_params=True)
    r = scaled.run("llama-3.2-1b", s, steps=2, progress=False)
    assert "FSDP1" in r.meta["engine"] and "torchrun" in r.meta["engine"]
    assert r.meta["losses"][1] < r.meta["losses"][0]
    twin, ts = scaled.scaled_setup("llama-3.2-1b", s)
    e = estimate.run(str(twin), ts, lifecycle=False)
    # GPU side: forward and backward. At the step the GPU holds nothing here, but gloo's collectives run on their own
    # thread, so the root's last reduce-scattered shard (its copy to the host done) is sometimes still being freed
    # when the step starts (seen once: 2 MiB, the twin's root shard in fp32); on a GPU, FSDP1's end-of-backward
    # callback synchronises first (_post_backward_final_callback).
    checked = {"gpu": ("forward", "backward"), "host": tuple(r.host.phases)}
    for dev, phases in checked.items():
        for phase in phases:
            got, want = r.device(dev).phases[phase], e.device(dev).phases[phase]
            assert abs(want - got) <= max(0.03 * got, BUFFERS_FLOOR), (dev, phase, want, got)
    assert r.host.breakdown["step"]["optimizer_states"] > 0 and r.gpu.breakdown["step"]["optimizer_states"] == 0


def test_registry_cli_and_explorer_offer_it(capsys):
    from helpers import explore

    assert "fsdp1" in strategies.NAMES and strategies.get("fsdp1").one_process_per_gpu
    assert "fsdp1" in explore.Explorer("llama-3-8b", TrainSetup(gpu_gib=80)).controls["strategy"].options
    code = main(["estimate", "--model", "llama-3-8b", "--strategy", "fsdp1", "--gpus", "8", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0 and d["setup"]["strategy"] == "fsdp1" and d["gpu"]["peak_bytes"] > 0


@pytest.mark.parametrize("options, message", [
    (dict(gpus=2, offload_optimizer=True, offload_params=True, offload_ratio=0.5),
     r"offload_ratio is honoured only by DeepSpeed ZeRO-3 .* got strategy 'fsdp1'"),
    (dict(gpus=2, offload_optimizer=True), r"FSDP1 .* offloads parameters, gradients and optimizer states together "
                                           r"\(CPUOffload\(offload_params=True\)\)"),
    (dict(gpus=2, lora_rank=8, base_weights="nf4"), "base_weights 'nf4' is modelled with strategies"),
    (dict(gpus=2, optimizer="adamw-8bit"), "optimizer 'adamw-8bit'"),
])
def test_bad_options_are_refused_in_one_line(options, message):
    with pytest.raises(InputError, match=message) as err:
        TrainSetup(strategy="fsdp1", **options).validate()
    assert "\n" not in str(err.value)


def test_dry_run_of_cpu_offload_is_refused_with_the_reason():
    s = TrainSetup(strategy="fsdp1", gpus=2, offload_optimizer=True, offload_params=True, pin_memory=False)
    with pytest.raises(InputError, match=r"no dry run of FSDP1 with CPU offload: .* `estimate` models it") as err:
        dryrun.run("llama-3.2-1b", s, progress=False)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name, options", [
    ("llama-3.2-1b", dict(gpus=4, seq=512)),
    ("qwen2.5-7b", dict(gpus=8, seq=512, checkpointing="full", precision="bf16")),
    ("llama-3.2-1b", dict(gpus=4, seq=512, lora_rank=16, checkpointing="full")),
], ids=["tied-mixed", "7b-bf16-ckpt", "lora-ckpt"])
def test_shard_grad_op_keeps_every_unit_gathered_to_its_backward(name, options):
    """SHARD_GRAD_OP (reshard_after_forward False): no unit is freed after its forward, so at the loss the whole
    16-bit model is unsharded on every GPU, in the dry run as in the estimate (to the byte there); once estimated as
    FULL_SHARD, a GiB under for a 1B model. Backward is counted a layer high at most (the last layer's prefetch)."""
    s = TrainSetup(strategy="fsdp1", reshard_after_forward=False, **options)
    d, e = dryrun.run(name, s, progress=False), estimate.run(name, s, lifecycle=False)
    full = estimate.run(name, s.replace(reshard_after_forward=True), lifecycle=False)
    for phase, got in d.gpu.phases.items():
        want = e.gpu.phases[phase]
        assert got - got // 400 <= want <= got * 1.025, phase
    assert e.gpu.breakdown["forward"]["temporaries"] == d.gpu.breakdown["forward"]["temporaries"] or s.lora_rank
    assert full.gpu.phases["forward"] < d.gpu.phases["forward"] - 2**28      # FULL_SHARD's figure: under
    with pytest.raises(InputError, match="reshard_after_forward False .* FSDP option: use it with strategy "
                                         "fsdp2 or fsdp1") as err:
        TrainSetup(strategy="zero3", gpus=2, reshard_after_forward=False).validate()
    assert "\n" not in str(err.value)


def test_readers_take_shard_grad_op_under_fsdp1_and_fsdp2(tmp_path):
    from helpers import readers

    trl = tmp_path / "sft.yaml"
    trl.write_text("model_name_or_path: meta-llama/Llama-3.2-1B\nbf16: true\nfsdp: shard_grad_op auto_wrap\n"
                   "fsdp_config:\n  version: 1\n")
    s = readers.read(trl, model="llama-3.2-1b").setup
    assert (s.strategy, s.reshard_after_forward) == ("fsdp1", False)
    launcher = tmp_path / "acc.yaml"
    launcher.write_text("distributed_type: FSDP\nnum_processes: 4\nmixed_precision: bf16\nfsdp_config:\n"
                        "  fsdp_version: 1\n  fsdp_sharding_strategy: SHARD_GRAD_OP\n")
    trl.write_text("model_name_or_path: meta-llama/Llama-3.2-1B\nbf16: true\n")
    s = readers.read([trl, launcher], model="llama-3.2-1b").setup
    assert (s.strategy, s.gpus, s.reshard_after_forward) == ("fsdp1", 4, False)
    launcher.write_text("distributed_type: FSDP\nnum_processes: 4\nmixed_precision: bf16\nfsdp_config:\n"
                        "  fsdp_version: 2\n  fsdp_reshard_after_forward: false\n")
    imp = readers.read([trl, launcher], model="llama-3.2-1b")
    assert (imp.setup.strategy, imp.setup.reshard_after_forward) == ("fsdp2", False)
    assert not any(n.key == "fsdp_config.fsdp_reshard_after_forward" for n in imp.not_modelled)
