"""Loading the model (helpers.estimate.loading): the host copy per rank measured through transformers' own
from_pretrained, the whole model DeepSpeed moves to the GPU without zero.Init read from its engine's tensors, and the
rules' reach (which set-ups hold what, the verdict's words, the options' checks)."""

import json
import subprocess
import sys

import pytest

from helpers import estimate, models, report
from helpers.errors import InputError
from helpers.estimate import loading
from helpers.measure import loading as measured_loading
from helpers.training import TrainSetup

GiB = 2**30


def test_a_converted_load_holds_the_whole_model_per_rank_and_a_same_dtype_load_maps_the_file():
    r = measured_loading.run("llama-3.2-1b")
    same, conv = r["loads"]["same dtype"], r["loads"]["float32"]
    # the same dtype: every parameter is a view of a checkpoint file's mapping (page cache, shared by the node)
    assert same["params_in_file_mappings"] == same["params"] and same["estimate_per_rank"] == 0
    assert same["anon_growth"] < 0.6 * same["param_bytes"]        # transformers' own objects, not a copy
    # float32 from a bf16 checkpoint: no parameter in a mapping; the private memory it adds is the estimate's copy
    assert conv["params_in_file_mappings"] == 0
    assert conv["estimate_per_rank"] == conv["param_bytes"] == r["params"] * 4
    assert r["converted_copy"] == pytest.approx(conv["estimate_per_rank"], rel=0.03)
    assert conv["estimate_host_setup"] == conv["estimate_per_rank"]      # one rank: the setup phase is that copy
    # accelerate's FSDP with cpu_ram_efficient_loading (transformers 5.23): rank 1 converts the whole model too
    f = r["fsdp_cpu_ram_efficient_loading"]
    assert [x["rank"] for x in f["ranks"]] == [0, 1] and all(x["env"] == measured_loading.FSDP_ENV for x in f["ranks"])
    assert f["estimate_per_rank"] == conv["estimate_per_rank"]
    assert all(c == pytest.approx(f["estimate_per_rank"], rel=0.03) for c in f["converted_copy_per_rank"])


def test_without_zero_init_deepspeed_holds_the_whole_16_bit_model_before_it_partitions():
    """The real engine (one rank, gloo, on this CPU): the census of the module's parameters when
    `_configure_distributed_model` returns (the engine's `module.to(device)`), then after `deepspeed.initialize`."""
    code = r"""
import json, torch
from helpers import models
from helpers.measure import engines, procgroup
from helpers.measure.scaled import initialize_deepspeed, scaled_setup
from deepspeed.runtime.engine import DeepSpeedEngine
from helpers.training import TrainSetup
procgroup.ensure("gloo", 1)
twin, s = scaled_setup("llama-3.2-1b", TrainSetup(strategy="zero3", zero3_init=False, seq=64))
seen = {}
original = DeepSpeedEngine._configure_distributed_model
def spy(self, model):
    original(self, model)
    ps = list(self.module.parameters())
    seen["moved"] = {"bytes": sum(p.numel() * p.element_size() for p in ps), "dtypes": sorted({str(p.dtype) for p in ps}),
                     "partitioned": sum(hasattr(p, "ds_id") for p in ps), "params": len(ps)}
DeepSpeedEngine._configure_distributed_model = spy
net = engines.build_model(str(twin), s, torch.float32, "sdpa")
engine, _, _ = initialize_deepspeed(net, s)
after = list(engine.module.parameters())
seen["after"] = {"partitioned": sum(hasattr(p, "ds_id") for p in after), "params": len(after)}
seen["params"] = models.spec(str(twin)).params
print(json.dumps(seen))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    moved = seen["moved"]
    assert moved["partitioned"] == 0 and moved["dtypes"] == ["torch.bfloat16"]     # whole, cast, not yet ZeRO's
    assert seen["after"]["partitioned"] == seen["after"]["params"]                 # partitioned afterwards
    twin = str(models.scaled_path("llama-3.2-1b"))
    est = estimate.run(twin, TrainSetup(strategy="zero3", zero3_init=False, seq=64))
    item = next(i for i in est.items if i["name"].startswith("the whole model before ZeRO-3"))
    assert item["bytes"] == moved["bytes"] == seen["params"] * 2 and item["phases"] == ["setup"]


@pytest.mark.parametrize("setup,dtype,copies", [
    (TrainSetup(precision="bf16"), "bf16", False),                          # the checkpoint's dtype: mapped
    (TrainSetup(), "fp32", True),                                           # bf16-mixed on torch: fp32 weights
    (TrainSetup(strategy="ddp", gpus=8, precision="fp32"), "fp32", True),
    (TrainSetup(strategy="zero2", gpus=8), "bf16", False),                  # DeepSpeed casts: loaded in bf16
    (TrainSetup(strategy="zero3", gpus=8, precision="fp32"), "fp32", False),   # zero.Init: rank 0 maps the file
    (TrainSetup(strategy="zero3", gpus=8, precision="fp32", zero3_init=False), "fp32", True),
    (TrainSetup(lora_rank=8), "bf16", False),                               # LoRA: the base in its own dtype
    (TrainSetup(lora_rank=8, base_weights="fp32"), "fp32", True),
    (TrainSetup(lora_rank=8, base_weights="nf4"), None, False),             # QLoRA: quantised onto the GPU
    (TrainSetup(strategy="fsdp2", gpus=8), "fp32", True),
    (TrainSetup(strategy="zero2", gpus=8, load_dtype="fp32"), "fp32", True),     # TRL's float32 default under ZeRO
    (TrainSetup(strategy="zero1", gpus=8, lora_rank=8, load_dtype="fp32"), "fp32", True),
    (TrainSetup(strategy="zero2", gpus=8, load_dtype="auto"), "bf16", False),    # auto: the checkpoint's own dtype
    (TrainSetup(strategy="zero3", gpus=8, load_dtype="fp32"), "fp32", False),    # zero.Init: rank 0 maps the file
])
def test_which_set_ups_hold_a_copy_per_rank(setup, dtype, copies):
    m = models.spec("llama-3-8b")                                            # saved in bf16
    assert m.checkpoint_dtype == "bf16"
    assert loading.loaded_dtype(setup, m) == dtype
    per_rank = loading.host_copy(setup, m)
    assert per_rank == (m.params * loading.BYTES[dtype] if copies else 0)
    r = estimate.run(m, setup)
    assert sum(i["bytes"] for i in r.meta["loading"] if i["device"] == "host") == per_rank * setup.ranks_per_node
    if copies:
        assert r.host.phases["setup"] >= per_rank * setup.ranks_per_node


def test_trl_under_zero2_converts_the_model_to_float32_on_every_rank_before_deepspeed_casts_it():
    """TRL loads in float32 unless its dtype says otherwise (create_model_from_path), and under DeepSpeed with
    device_map None: on the host. Llama-3.1-8B on 8 GPUs: 8 x 4 B per parameter at load, where a bf16 load maps the
    file; the step itself (DeepSpeed's bf16 engine) is the same."""
    m = models.spec("llama-3.1-8b")
    trl = estimate.run(m, TrainSetup(strategy="zero2", gpus=8, load_dtype="fp32", host_gib=256))
    bf16 = estimate.run(m, TrainSetup(strategy="zero2", gpus=8, host_gib=256))
    assert trl.host.phases["setup"] == 8 * m.params * 4 and bf16.host.phases["setup"] == 0
    assert trl.gpu.phases == bf16.gpu.phases
    assert "loaded as fp32 (the dtype the training script asks for, load_dtype; DeepSpeed casts the module to bf16 " \
           "afterwards) from a bf16 checkpoint: converted on every rank" in report.table(trl)
    small = estimate.run(m, TrainSetup(strategy="zero2", gpus=8, load_dtype="fp32", host_gib=200))
    assert small.oom == {"device": "host", "phase": "setup"}


def test_load_dtype_auto_follows_the_checkpoint_and_fp32_where_its_config_names_none():
    gemma = models.spec("gemma-2-2b")                   # its Hub checkpoint is float32
    auto = TrainSetup(strategy="zero2", gpus=8, load_dtype="auto")
    assert loading.loaded_dtype(auto, gemma) == "fp32" and loading.host_copy(auto, gemma) == 0
    assert loading.loaded_dtype(auto) == "fp32"         # no model: transformers' default dtype


@pytest.mark.parametrize("changes,words", [
    (dict(strategy="fsdp2", gpus=8, load_dtype="fp32"),
     "load_dtype 'fp32' is a DeepSpeed option (DeepSpeed casts the model it is given): under strategy 'fsdp2' the "
     "model is loaded in the dtype the engine trains its weights in (set precision or base_weights instead)"),
    (dict(strategy="zero2", load_dtype="float32"), "unknown load_dtype 'float32': allowed are fp32, bf16, fp16, auto"),
    (dict(strategy="zero2", lora_rank=8, base_weights="nf4", load_dtype="bf16"),
     "load_dtype 'bf16' with a 4-bit base (base_weights 'nf4'): bitsandbytes quantises the base as it loads; leave "
     "load_dtype out"),
])
def test_bad_load_dtype_is_one_line(changes, words):
    with pytest.raises(InputError) as e:
        TrainSetup(**changes).validate()
    assert str(e.value) == words


def test_fixes_offer_loading_in_the_compute_dtype_and_a_torch_engine_without_it():
    from helpers import fixes

    s = TrainSetup(strategy="zero2", gpus=8, load_dtype="fp32", host_gib=200, gpu_gib=80)
    skipped = []
    ways = {w.name: w for w in fixes.ways_out("llama-3.1-8b", s, skipped=skipped)}
    load = ways["model loaded in its compute dtype (TRL: dtype bfloat16)"]
    assert load.fits and load.change == {"load_dtype": None} and load.result.host.phases["setup"] == 0
    assert ways["strategy fsdp2"].change["load_dtype"] is None           # tried, not refused
    assert not [name for name, _ in skipped if name.startswith("strategy ")]


def test_a_checkpoint_saved_in_fp32_or_of_unknown_dtype_is_copied_when_loaded_in_16_bits():
    gemma = models.spec("gemma-2-2b")                   # its Hub checkpoint is float32
    assert gemma.checkpoint_dtype == "fp32"
    assert loading.host_copy(TrainSetup(precision="bf16"), gemma) == gemma.params * 2
    assert loading.host_copy(TrainSetup(), gemma) == 0
    assert models.checkpoint_dtype({"torch_dtype": "float16"}) == "fp16"
    assert models.checkpoint_dtype({"dtype": "bfloat16", "torch_dtype": "float32"}) == "bf16"   # transformers 5's key
    assert models.checkpoint_dtype({"torch_dtype": "auto"}) is None
    assert models.checkpoint_dtype({}) is None


def test_a_host_that_cannot_hold_every_ranks_copy_runs_out_while_the_model_loads():
    r = estimate.run("llama-3.1-8b", TrainSetup(strategy="fsdp2", gpus=8, host_gib=128))
    assert r.oom == {"device": "host", "phase": "setup"}
    assert r.host.phases["setup"] == 8 * models.spec("llama-3.1-8b").params * 4
    text = report.table(r)
    assert "OOM on HOST at the setup, while the model loads" in text
    assert "loading the model (part of setup): the model converted to fp32 as it loads (x8 ranks)" in text


def test_zero3_without_zero_init_runs_out_at_setup_where_zero_init_fits():
    with_init = estimate.run("llama-3.1-70b", TrainSetup(strategy="zero3", gpus=8, checkpointing="full",
                                                          gpu_gib=79.1))
    without = estimate.run("llama-3.1-70b", TrainSetup(strategy="zero3", gpus=8, checkpointing="full", gpu_gib=79.1,
                                                        zero3_init=False))
    assert with_init.oom["phase"] != "setup" and with_init.gpu.phases["setup"] < 70 * GiB
    assert without.gpu.phases["setup"] == models.spec("llama-3.1-70b").params * 2
    assert without.oom == {"device": "gpu", "phase": "setup"}
    assert "while the model loads" in report.verdict(without)
    assert without.gpu.phases["forward"] == with_init.gpu.phases["forward"]     # only the loading differs


@pytest.mark.parametrize("changes,words", [
    (dict(strategy="zero2", zero3_init=False), "zero3_init False (the model loaded whole before DeepSpeed partitions "
                                               "it) is a ZeRO-3 option: use it with strategy zero3, got 'zero2'"),
    (dict(strategy="zero3", zero3_init="no"), "zero3_init must be True or False, got 'no'"),
])
def test_bad_zero3_init_is_one_line(changes, words):
    with pytest.raises(InputError) as e:
        TrainSetup(**changes).validate()
    assert words in str(e.value) and "\n" not in str(e.value)


def test_cli_takes_no_zero3_init_and_says_where_it_runs_out(capsys):
    from helpers.__main__ import main

    assert main(["estimate", "--model", "llama-3.1-70b", "--strategy", "zero3", "--gpus", "8", "--no-zero3-init",
                 "--gpu", "h100-80gb", "--checkpointing", "full"]) == 0
    out = capsys.readouterr().out
    assert "OOM on GPU at the setup, while the model loads: 131.4 GiB needed there" in out
    assert "the whole model before ZeRO-3 partitions it (bf16), 131.4 GiB per GPU" in out
    assert main(["estimate", "--model", "llama-3.1-8b", "--no-zero3-init"]) == 2
    assert "is a ZeRO-3 option" in capsys.readouterr().err
    assert main(["estimate", "--model", "llama-3.1-8b", "--strategy", "fsdp1", "--gpus", "2", "--zero3-init"]) == 2
    err = capsys.readouterr().err                             # the default value, typed for another engine: refused
    assert "--zero3-init (the model built already partitioned under deepspeed.zero.Init) is a ZeRO-3 option" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("setup,words", [
    (TrainSetup(strategy="zero2", gpus=8), "loaded as bf16 (DeepSpeed casts the module itself) from a bf16 checkpoint: "
                                           "the weights are its memory-mapped files"),
    (TrainSetup(strategy="zero3", gpus=8), "built already partitioned under deepspeed.zero.Init; global rank 0 reads"),
    (TrainSetup(lora_rank=8, base_weights="nf4"), "a 4-bit base is quantised as it is loaded onto the GPU"),
    (TrainSetup(strategy="fsdp2", gpus=8), "loaded as fp32 (the dtype the engine trains its weights in) from a bf16 "
                                           "checkpoint: converted on every rank"),
    (TrainSetup(lora_rank=8, base_weights="fp32"), "loaded as fp32 (the frozen base's dtype: base_weights fp32) from a "
                                                   "bf16 checkpoint: converted on every rank"),
    (TrainSetup(lora_rank=8), "loaded as bf16 (the frozen base's dtype, the compute dtype) from a bf16 checkpoint"),
    (TrainSetup(strategy="zero2", gpus=8, load_dtype="bf16"), "loaded as bf16 (the dtype the training script asks "
                                                              "for, load_dtype; DeepSpeed's compute dtype) from a bf16"),
])
def test_the_output_says_how_the_model_is_loaded_where_it_counts_nothing_too(setup, words):
    text = report.table(estimate.run("llama-3.1-8b", setup))
    line = next(x for x in text.splitlines() if x.startswith("loading the model (part of setup): "))
    assert words in line


def test_a_host_oom_at_load_is_answered_by_fewer_gpus_per_node_or_more_host_ram():
    from helpers import fixes

    setup = TrainSetup(strategy="fsdp1", gpus=8, gpu_gib=79.1, host_gib=128, checkpointing="full")
    base = estimate.run("llama-2-7b", setup)
    assert base.oom == {"device": "host", "phase": "setup"}
    ways = fixes.ways_out("llama-2-7b", setup)
    by = {w.name: w for w in ways}
    per_node = by["fewer GPUs per node (4 per node, 2 nodes)"]      # 5 per node would leave a node part-full
    assert per_node.fits and per_node.change == {"gpus_per_node": 4}
    assert per_node.result.host.phases["setup"] * 2 == base.host.phases["setup"]       # half the ranks' copies
    need = -(-base.host.peak_bytes // GiB)
    ram = by[f"more host RAM ({need} GiB per node)"]
    assert ram.fits and ram.result.host.peak_bytes == base.host.peak_bytes
    assert per_node.step_seconds_added is None and "costs nodes" in per_node.cost_basis
    assert ram.step_seconds_added is None and "hardware" in ram.cost_basis
    # the ones that fit, first: LoRA too (FSDP1 with LoRA loads its frozen base in bf16 from the memory-mapped
    # checkpoint, no fp32 conversion per rank), a changed run rather than the same one
    lora = by["LoRA rank 8"]
    assert lora.fits and lora.step_seconds_added is None and "LoRA changes what is trained" in lora.cost_basis
    assert {w.name for w in ways[:3]} == {per_node.name, ram.name, lora.name}
    assert not any(w.fits for w in ways[3:])          # nothing else on the GPU side lowers the host's loading copies
    assert all(not fixes.lowers(base, w.result) for w in ways if w.name.startswith("checkpointing"))


def test_where_the_host_fits_no_host_change_is_offered():
    from helpers import fixes

    skipped = []
    ways = fixes.ways_out("llama-2-7b", TrainSetup(strategy="fsdp1", gpus=8, gpu_gib=10, host_gib=512),
                          skipped=skipped)
    assert not any(w.name.startswith(("fewer GPUs per node", "more host RAM")) for w in ways)
    assert ("more host RAM", "the host fits as given") in skipped


def test_explain_answers_a_killed_load_with_the_host_ways_out():
    from helpers import explain

    log = "Loading checkpoint shards:  50%|#####     | 1/2\nKilled\n"
    ex = explain.explain(log, "llama-2-7b", TrainSetup(strategy="fsdp1", gpus=8, gpu_gib=79.1, host_gib=128,
                                                       checkpointing="full"))
    text = "\n".join(ex.lines)
    assert ex.ways_shown == ["LoRA rank 8", "fewer GPUs per node (4 per node, 2 nodes)",
                             "more host RAM (201 GiB per node)"]             # (LoRA: its base loaded in bf16)
    assert "fewer GPUs per node (4 per node, 2 nodes): 100.4 GiB host per node, from 200.8" in text
    assert "more host RAM (201 GiB per node): the run needs 200.8 GiB host per node" in text
