"""LoRA under FSDP1 as the HF Trainer runs it (peft's fsdp_auto_wrap_policy: every adapter weight a unit of its own,
each decoder layer's frozen weights another, the frozen embedding, norm and head the root; accelerate's autocast
around the forward): checked against exact counts of the model built on the meta device, against its dry run on a
fake process group (the first iteration's input copies, and every iteration's with use_orig_params), against FSDP1
itself training the twin under torchrun (CPUOffload's host gradient buffers, frozen units' too), and through the CLI
and the readers."""

import json
import math

import pytest
import torch

from helpers import estimate, models, readers
from helpers.__main__ import main
from helpers.errors import InputError
from helpers.estimate import activations
from helpers.measure import dryrun, scaled
from helpers.training import TrainSetup

BUFFERS_FLOOR = 8 * 2**10       # the model's own buffers (rotary inv_freq), which the estimate leaves out


def units(name: str) -> tuple[int, list[int]]:
    """(the root unit's elements, each decoder layer's) of the model built on the meta device: what FSDP1 flattens."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        net = AutoModelForCausalLM.from_config(models.load_config(models.spec(name).path))
    layers = [sum(p.numel() for p in layer.parameters()) for layer in net.model.layers]
    return sum(p.numel() for p in net.parameters()) - sum(layers), layers


def adapter_shapes(name: str, rank: int) -> list[tuple[int, int]]:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        net = AutoModelForCausalLM.from_config(models.load_config(models.spec(name).path))
    shapes = []
    for mod in net.model.layers.modules():
        if isinstance(mod, torch.nn.Linear):
            shapes += [(rank, mod.in_features), (mod.out_features, rank)]
    return shapes


def item(result, start: str) -> dict:
    return next(i for i in result.items if i["name"].startswith(start))


@pytest.mark.parametrize("gpus, rank, precision", [(8, 16, "bf16-mixed"), (3, 8, "bf16"), (6, 8, "fp32")])
def test_items_match_exact_counts_of_the_meta_model(gpus, rank, precision):
    root, layers = units("llama-3-8b")
    e = estimate.run("llama-3-8b", TrainSetup(strategy="fsdp1", gpus=gpus, lora_rank=rank, precision=precision,
                                              seq=256))
    base_dtype = 4 if precision == "fp32" else 2                  # the frozen base is loaded in the compute dtype
    adapter_dtype = 2 if precision == "bf16" else 4               # trained flat parameters fp32 under mixed precision
    padded_shard = lambda n: math.ceil(n / gpus)                  # a FlatParameter padded to a multiple of N, 1/N kept
    assert item(e, "frozen base partitions")["bytes"] == sum(map(padded_shard, [root] + layers)) * base_dtype
    adapters = [math.prod(s) for s in adapter_shapes("llama-3-8b", rank)]
    assert sum(adapters) == models.spec("llama-3-8b").lora_params(rank)
    shards = sum(map(padded_shard, adapters)) * adapter_dtype      # one unit per adapter weight
    assert item(e, "sharded LoRA adapters")["bytes"] == shards
    assert item(e, "sharded gradients of the adapters")["bytes"] == shards
    assert item(e, "AdamW exp_avg + exp_avg_sq of the adapters")["bytes"] == 2 * shards
    assert item(e, "unsharded root unit")["bytes"] == padded_shard(root) * gpus * base_dtype
    # the frozen base makes no gradient, no reduce-scatter and no optimizer state
    assert not any(i["category"] in ("gradients", "optimizer_states") and "adapters" not in i["name"]
                   for i in e.items)


@pytest.mark.parametrize("name, options", [
    ("llama-3.2-1b", dict(gpus=4, seq=512)),
    ("llama-3.2-1b", dict(gpus=4, seq=512, use_orig_params=True)),
    ("llama-3.2-1b", dict(gpus=4, seq=512, lora_dropout=0.05, checkpointing="full", batch=2)),
    ("qwen2.5-0.5b", dict(gpus=2, seq=512, precision="bf16", grad_accum=2)),
    ("tinyllama-1.1b", dict(gpus=16, seq=256, precision="fp32", lora_targets="q,v")),
], ids=["tied-mixed", "orig-params", "dropout-ckpt", "bf16-accum", "fp32-16-ranks-qv"])
def test_dry_run_agrees_with_the_estimate_on_every_phase(name, options):
    """Every phase within 2% of FSDP1's own dry run (the last layer's backward is counted with every layer's
    activations, one layer's too many: +1.5% in fp32 on 16 ranks, where two gathered layers outweigh the logits) and
    never under by more than 0.25% (there a forward gather is 3.7 MiB above the estimate's, 0.23%); the step (no
    checkpoint save in a dry run) with lifecycle off."""
    s = TrainSetup(strategy="fsdp1", lora_rank=16, **options)
    d, e = dryrun.run(name, s, progress=False), estimate.run(name, s, lifecycle=False)
    for phase, got in d.gpu.phases.items():
        want = e.gpu.phases[phase]
        assert want == pytest.approx(got, rel=0.02, abs=BUFFERS_FLOOR), phase
        assert want >= got - BUFFERS_FLOOR - got // 400, phase
    step_d, step_e = d.gpu.breakdown["step"], e.gpu.breakdown["step"]
    assert step_d["gradients"] == step_e["gradients"] > 0                      # the adapters' shards, exactly
    assert step_d["optimizer_states"] == step_e["optimizer_states"] == 2 * step_e["gradients"]


def test_the_first_iteration_keeps_copies_that_later_ones_do_not():
    """use_orig_params False (accelerate's default): the adapters read as fp32 only until their unit is first
    gathered, so iteration 1 keeps each adapted linear's own copy of its input and iteration 2 does not; True keeps
    them every time. The estimate says the same, by the same number of bytes as the dry run."""
    s = TrainSetup(strategy="fsdp1", gpus=4, lora_rank=16, seq=512)
    assert activations.first_iteration_casts(s) and not activations.every_iteration_casts(s)
    d = dryrun.run("llama-3.2-1b", s, progress=False)
    e = estimate.run("llama-3.2-1b", s, lifecycle=False)
    first_d = d.gpu.breakdown["backward"]["activations"] - d.gpu.breakdown["steady"]["activations"]
    first_e = e.gpu.breakdown["backward"]["activations"] - e.gpu.breakdown["steady"]["activations"]
    m = models.spec("llama-3.2-1b")
    four_copies = 4 * 512 * m.hidden * 2 * m.layers            # q, k, v, o and gate, up: 4 more per layer, bf16
    assert first_d == first_e == four_copies
    orig = s.replace(use_orig_params=True)
    d2 = dryrun.run("llama-3.2-1b", orig, progress=False)
    assert d2.gpu.breakdown["steady"]["activations"] == d.gpu.breakdown["backward"]["activations"]
    assert estimate.run("llama-3.2-1b", orig, lifecycle=False).gpu.breakdown["steady"]["activations"] == \
        e.gpu.breakdown["backward"]["activations"]


@pytest.mark.parametrize("options", [
    dict(precision="bf16-mixed"),
    dict(offload_optimizer=True, offload_params=True, pin_memory=False),
], ids=["mixed", "offload"])
def test_scaled_run_under_torchrun(options):
    """FSDP1 trains the twin in 2 processes with peft's wrap policy: rank 0's gradients and AdamW states are the
    adapters' shards alone on the GPU; with CPUOffload every unit, frozen ones too, has a host gradient buffer as
    large as its shard (`_cpu_grad`), which the estimate counts to the byte; every phase within 3%."""
    s = TrainSetup(strategy="fsdp1", gpus=2, gpus_per_node=2, batch=2, seq=64, lora_rank=8, **options)
    r = scaled.run("llama-3.2-1b", s, steps=2, progress=False)
    assert "FSDP1" in r.meta["engine"] and "fsdp_auto_wrap_policy" in r.meta["engine"]
    assert r.meta["losses"][1] < r.meta["losses"][0]
    twin, ts = scaled.scaled_setup("llama-3.2-1b", s)
    e = estimate.run(str(twin), ts, lifecycle=False)
    if s.offload_params:
        root, layers = units(str(twin))
        base = sum(math.ceil(n / 2) for n in [root] + layers) * 2 * s.ranks_per_node
        assert r.host.breakdown["step"]["gradients"] == e.host.breakdown["step"]["gradients"] > base
        assert r.host.breakdown["step"]["parameters"] == e.host.breakdown["step"]["parameters"]
    else:
        assert r.gpu.breakdown["step"]["gradients"] == e.gpu.breakdown["step"]["gradients"] > 0
        assert r.gpu.breakdown["step"]["optimizer_states"] == 2 * r.gpu.breakdown["step"]["gradients"]
    for dev in ("gpu", "host"):
        for phase, got in r.device(dev).phases.items():
            assert e.device(dev).phases[phase] == pytest.approx(got, rel=0.03, abs=BUFFERS_FLOOR), (dev, phase)


def test_lora_on_moe_experts_is_refused_in_one_line_and_attention_adapters_are_not():
    s = TrainSetup(strategy="fsdp1", gpus=8, lora_rank=16, seq=256)
    for run in (lambda: estimate.run("mixtral-8x7b", s), lambda: dryrun.run("mixtral-8x7b", s, progress=False)):
        with pytest.raises(InputError, match="MoE experts under strategy 'fsdp1' fails before it trains") as err:
            run()
        assert "\n" not in str(err.value)
    e = estimate.run("mixtral-8x7b", s.replace(lora_targets="q,v"))
    assert e.gpu.peak_bytes > 0


def test_use_orig_params_is_an_fsdp1_option():
    with pytest.raises(InputError, match="use_orig_params is an FSDP1 option") as err:
        TrainSetup(strategy="fsdp2", gpus=2, use_orig_params=True).validate()
    assert "\n" not in str(err.value)


def test_cli_estimates_it(capsys):
    code = main(["estimate", "--model", "llama-3-8b", "--strategy", "fsdp1", "--gpus", "8", "--lora-rank", "8",
                 "--use-orig-params", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0 and d["setup"]["strategy"] == "fsdp1" and d["setup"]["use_orig_params"] is True
    names = [i["name"] for i in d["items"]]
    assert any(n.startswith("sharded LoRA adapters") for n in names)
    assert any(n.startswith("frozen base partitions") for n in names)


AXOLOTL = """base_model: meta-llama/Llama-3.2-1B
adapter: lora
lora_r: 16
lora_target_linear: true
sequence_len: 1024
micro_batch_size: 2
bf16: auto
fsdp:
  - full_shard
  - auto_wrap
fsdp_config:
  fsdp_use_orig_params: {orig}
  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
"""

TRL = """model_name_or_path: meta-llama/Llama-3.2-1B
use_peft: true
lora_r: 16
bf16: true
fsdp: full_shard auto_wrap
fsdp_config:
  version: 1
"""


@pytest.mark.parametrize("orig", ["true", "false"])
def test_axolotl_reads_use_orig_params(tmp_path, orig):
    f = tmp_path / "lora_fsdp.yml"
    f.write_text(AXOLOTL.format(orig=orig))
    imported = readers.read(f, model="llama-3.2-1b")
    s = imported.setup
    assert s.strategy == "fsdp1" and s.lora_rank == 16 and s.use_orig_params is (orig == "true")


def test_trl_takes_transformers_default_of_use_orig_params(tmp_path):
    """transformers' TrainingArguments hand FSDP1 use_orig_params=True where fsdp_config leaves it out."""
    f = tmp_path / "sft.yml"
    f.write_text(TRL)
    imported = readers.read(f, model="llama-3.2-1b")
    assert imported.setup.strategy == "fsdp1" and imported.setup.use_orig_params is True
    assert any(d.key == "fsdp_config.use_orig_params" and "transformers" in d.tool for d in imported.defaults)


def test_the_recorded_mixtral_row_attention_adapters_only():
    """The grid's Mixtral-8x7B row under FSDP1 with q,v adapters (data/results/dryrun_vs_estimate.json): its peak (the
    backward) is over the dry run, and its forward, a gathered MoE layer's moment, under by less than 1% (0.77%
    recorded: what the MoE layer's forward working set leaves out there is not yet located)."""
    doc = json.loads((models.DATA_DIR / "results" / "dryrun_vs_estimate.json").read_text())
    (row,) = [r for r in doc["rows"] if r["model"] == "mixtral-8x7b" and r["setup"]["strategy"] == "fsdp1"]
    e = estimate.run("mixtral-8x7b", TrainSetup(**row["setup"]), lifecycle=False)
    dry = row["dry_run"]["gpu"]["phases"]
    assert e.gpu.peak_bytes >= max(dry.values())
    for phase, got in dry.items():
        assert got * 0.99 <= e.gpu.phases[phase] <= got * 1.02, phase
