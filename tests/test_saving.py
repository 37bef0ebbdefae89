"""Saving a checkpoint (helpers.estimate.saving): the save items against the real DeepSpeed engine's save calls
(recorded by helpers.measure.saving, one case run live), and the rules' reach: which set-ups hold what while the
Trainer saves, the verdict's words, the ways out, and the options read from users' files."""

import json
from pathlib import Path

import pytest

from helpers import estimate, fixes, models, report
from helpers.errors import InputError
from helpers.estimate import loading, saving
from helpers.measure import saving as measured_saving
from helpers.training import TrainSetup
from helpers.units import next_power_of_2

GiB = 2**30
P8 = models.spec("llama-3.1-8b").params


def _read(tmp_path, name, text):
    """The set-up the readers make of one file written with `text`."""
    from helpers import readers

    f = tmp_path / name
    f.write_text(text)
    return readers.read([str(f)]).setup


def _saving(r, name):
    return sum(i["bytes"] for i in r.meta["saving"] if i["name"].startswith(name))


def test_the_recorded_save_calls_of_the_real_engine_agree_with_the_rules():
    doc = json.loads(measured_saving.SAVED.read_text())
    twin = models.scaled_path(doc["model"], measured_saving.HIDDEN)     # written here if this machine lacks it
    assert twin.name == Path(doc["twin"]).name                          # the same twin (its name holds a content hash)
    spec = models.spec(str(twin))
    assert {(x["case"], x["world"]) for x in doc["rows"]} == {(c[0], c[1]) for c in measured_saving.CASES}
    for x in doc["rows"]:
        r = estimate.run(spec, TrainSetup(gpus=x["world"], gpus_per_node=x["world"], **x["setup"]))
        rule = _saving(r, x["estimate_item"])
        assert rule == x["estimate"], x["case"]                          # the rule has not moved since the record
        assert abs(x["measured"] / rule - 1) < 0.01, (x["case"], x["world"], x["measured"], rule)
        assert len(x["ranks"]) == x["world"]


def test_a_live_zero2_save_model_clones_the_whole_model_and_the_tied_embedding_twice():
    import os
    import sys

    from helpers.measure import children, procgroup

    twin = str(models.scaled_path(measured_saving.MODEL, measured_saving.HIDDEN))
    spec = models.spec(twin)
    from helpers.errors import MeasurementError

    procgroup.ensure("gloo", 1)     # as in CI, where an earlier test on this worker made one: the child must not bind its port
    for attempt in range(3):         # a free port, chosen and let go, can still be taken before gloo binds it
        try:
            proc = children.run([sys.executable, "-m", "helpers.measure.saving", "--worker", "--twin", twin, "--call",
                                 "clone"], {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"},
                                timeout=600, what="the save measurement")
            break
        except MeasurementError as exc:
            if "EADDRINUSE" not in str(exc) or attempt == 2:
                raise
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    rule = _saving(estimate.run(spec, TrainSetup(strategy="zero2")), "state dict cloned")
    assert rule == spec.params * 2 + spec.tensors[0].numel * 2          # tied: one clone per state-dict key
    assert abs(got["peak"] / rule - 1) < 0.01


def test_the_trainer_under_zero2_clones_the_model_on_every_rank_of_the_node():
    r = estimate.run("llama-3.1-8b", TrainSetup(strategy="zero2", gpus=8, host_gib=64))
    assert _saving(r, "state dict cloned") == 8 * (P8 * 2)
    assert r.oom == {"device": "host", "phase": "step"}
    assert "OOM on HOST at the optimizer step, while the checkpoint is saved" in report.verdict(r)
    assert "saving a checkpoint (after an optimizer step, counted in it)" in report.table(r)
    step_only = estimate.run("llama-3.1-8b", TrainSetup(strategy="zero2", gpus=8, host_gib=64), lifecycle=False)
    assert step_only.oom["device"] is None and not step_only.meta["saving"]


def test_zero3_gathers_the_16_bit_model_on_rank_0_unless_told_not_to():
    on = estimate.run("llama-3.1-8b", TrainSetup(strategy="zero3", gpus=8))
    off = estimate.run("llama-3.1-8b", TrainSetup(strategy="zero3", gpus=8, save_16bit=False))
    assert _saving(on, "16-bit model gathered") == P8 * 2
    assert _saving(off, "16-bit model gathered") == 0
    assert _saving(on, "the largest module") == max(t.numel for t in models.spec("llama-3.1-8b").tensors) * 2
    m = models.spec("llama-3.1-8b")
    assert saving.largest_sub_group(m, TrainSetup(strategy="zero3", gpus=8), 8) >= 10**9      # sub_group_size
    lora = estimate.run("llama-3.1-8b", TrainSetup(strategy="zero3", gpus=8, lora_rank=8))
    assert _saving(lora, "16-bit model gathered") < 200 * 2**20               # the adapters alone


def test_fsdp_saves_the_full_state_dicts_on_rank_0_or_each_rank_its_shard():
    full = estimate.run("llama-3.1-8b", TrainSetup(strategy="fsdp2", gpus=8))
    sharded = estimate.run("llama-3.1-8b", TrainSetup(strategy="fsdp2", gpus=8, sharded_save=True))
    assert _saving(full, "full model state dict") == P8 * 4                  # fp32 weights (bf16-mixed)
    assert _saving(full, "full optimizer state dict") == P8 * 8               # exp_avg and exp_avg_sq
    widest = max(t.numel for t in models.spec("llama-3.1-8b").tensors)
    tensor = 4 * -(-widest // 8)                      # the embedding's fp32 Adam state, one rank's shard
    assert _saving(sharded, "two largest tensors") == 8 * 2 * tensor
    rounding = [i for i in sharded.items if i["name"].startswith("rounding of two largest tensors")][0]
    cached = [i for i in sharded.items if i["name"].startswith("cached pinned blocks of two largest tensors")][0]
    assert rounding["bytes"] + 8 * 2 * tensor == cached["bytes"] == 8 * 2 * 2**28      # 250.5 MiB -> 256 MiB blocks
    assert cached["phases"] == ["steady"]                 # the pinned blocks stay cached after the save, not before
    assert sharded.host.phases["step"] == 8 * 2 * 2**28 and sharded.host.phases["backward"] == 0


def test_a_full_save_with_tensor_parallelism_gathers_the_whole_model_a_sharded_one_each_ranks_share():
    """A tensor-parallel rank holds half the weights, but FULL_STATE_DICT gathers every DTensor over its whole mesh:
    rank 0's host gets the whole model and its whole optimizer state, as without TP. A sharded save writes one
    rank's share: the widest tensor split over TP and the data-parallel ranks (2 x 4 here, as 8 ways without TP)."""
    widest = max(t.numel for t in models.spec("llama-3.1-8b").tensors)
    for strategy, gpus in (("fsdp2", 8), ("ddp", 2)):
        tp = estimate.run("llama-3.1-8b", TrainSetup(strategy=strategy, gpus=gpus, tensor_parallel=2))
        if strategy == "fsdp2":
            assert _saving(tp, "full model state dict") == P8 * 4 and _saving(tp, "full optimizer state dict") == P8 * 8
            assert _saving(tp, "one parameter gathered") == widest * 4
            sharded = estimate.run("llama-3.1-8b", TrainSetup(strategy=strategy, gpus=gpus, tensor_parallel=2,
                                                              sharded_save=True))
            assert _saving(sharded, "two largest tensors") == 8 * 2 * 4 * -(-widest // 8)
        else:
            assert _saving(tp, "model written by save_pretrained") == P8 * 4
            assert _saving(tp, "optimizer state written") == 4 * widest


def test_one_gpu_writes_the_model_then_one_optimizer_tensor_at_a_time():
    r = estimate.run("qwen3-0.6b", TrainSetup())
    m = models.spec("qwen3-0.6b")
    assert _saving(r, "model written by save_pretrained") == m.params * 4
    assert _saving(r, "optimizer state written") == 4 * max(t.numel for t in m.tensors)
    assert _saving(estimate.run("qwen3-0.6b", TrainSetup(lora_rank=8)), "model written") < 50 * 2**20


def test_a_host_oom_at_save_is_answered_by_the_save_options():
    setup = TrainSetup(strategy="fsdp2", gpus=16, precision="bf16", gpu_gib=79.1, host_gib=48)    # two nodes
    base = estimate.run("llama-3.1-8b", setup)
    assert base.oom == {"device": "host", "phase": "step"} and base.host.phases["step"] == P8 * 8
    by = {w.name: w for w in fixes.ways_out("llama-3.1-8b", setup)}
    sharded = by["sharded checkpoints (SHARDED_STATE_DICT)"]
    widest = max(t.numel for t in models.spec("llama-3.1-8b").tensors)
    assert sharded.fits and sharded.result.host.phases["step"] == 8 * 2 * next_power_of_2(4 * -(-widest // 16))
    z3 = {w.name: w for w in fixes.ways_out("llama-3.1-70b", TrainSetup(strategy="zero3", gpus=32, gpu_gib=79.1,
                                                                        host_gib=128, checkpointing="full"))}
    assert z3["no 16-bit gather at save (stage3_gather_16bit_weights_on_model_save false)"].fits


@pytest.mark.parametrize("changes,words", [
    (dict(strategy="zero2", save_16bit=False), "save_16bit False (no 16-bit gather at save) is a ZeRO-3 option"),
    (dict(strategy="zero3", sharded_save=True), "sharded_save (FSDP's SHARDED_STATE_DICT) is an FSDP option"),
    (dict(strategy="fsdp2", sharded_save="yes"), "sharded_save must be True or False, got 'yes'"),
])
def test_bad_save_options_are_one_line(changes, words):
    with pytest.raises(InputError) as e:
        TrainSetup(**changes).validate()
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text,expect", [
    ('{"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": true}}', True),
    ('{"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": "auto"}}', False),
    ('{"zero_optimization": {"stage": 3}}', False),
    ('{"zero_optimization": {"stage": 3, "gather_16bit_weights_on_model_save": false}}', False),
])
def test_the_deepspeed_reader_sets_the_16_bit_gather(tmp_path, text, expect):
    assert _read(tmp_path, "ds.json", text).save_16bit is expect


@pytest.mark.parametrize("kind,expect", [("FULL_STATE_DICT", False), ("SHARDED_STATE_DICT", True)])
def test_the_accelerate_reader_sets_the_state_dict_type(tmp_path, kind, expect):
    assert _read(tmp_path, "acc.yaml", f"distributed_type: FSDP\nnum_processes: 8\nfsdp_config:\n  fsdp_version: 2\n"
                                       f"  fsdp_state_dict_type: {kind}\n").sharded_save is expect


def test_a_bad_state_dict_type_is_one_line(tmp_path):
    with pytest.raises(InputError) as e:
        _read(tmp_path, "acc.yaml", "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_state_dict_type: HALF\n")
    assert "fsdp_state_dict_type must be FULL_STATE_DICT, SHARDED_STATE_DICT or LOCAL_STATE_DICT, got 'HALF'" in str(e.value)


def test_an_fp32_zero3_run_gathers_its_fp32_parameters():
    r = estimate.run("llama-3.1-8b", TrainSetup(strategy="zero3", gpus=8, precision="fp32"))
    assert _saving(r, "fp32 model gathered on rank 0") == P8 * 4          # DeepSpeed gathers the parameters' dtype


@pytest.mark.parametrize("flag,expect", [("false", False), ("true", True)])
def test_accelerates_zero3_init_flag_sets_zero3_init(tmp_path, flag, expect):
    assert _read(tmp_path, "acc.yaml", f"distributed_type: DEEPSPEED\nnum_processes: 8\ndeepspeed_config:\n"
                                       f"  zero_stage: 3\n  zero3_init_flag: {flag}\n").zero3_init is expect


def test_a_false_zero3_init_flag_below_stage_3_is_said_not_dropped(tmp_path):
    """TRL's own ZeRO-2 accelerate config says zero3_init_flag: false; it changes nothing at stage 2, and the row says
    what it would do at stage 3 (a user moving to stage 3 keeps it), where an ignored list would hide it."""
    from helpers.readers import read

    (tmp_path / "acc.yaml").write_text("distributed_type: DEEPSPEED\nnum_processes: 8\ndeepspeed_config:\n"
                                       "  zero_stage: 2\n  zero3_init_flag: false\n")
    imp = read(tmp_path / "acc.yaml")
    row = next(x for x in imp.settings if x.key == "deepspeed_config.zero3_init_flag")
    assert row.sets == "none at stage 2; at 3: loads whole" and row.fields == {}
    assert imp.setup.zero3_init and "deepspeed_config.zero3_init_flag" not in [x.key for x in imp.ignored]
    (tmp_path / "on.yaml").write_text("distributed_type: DEEPSPEED\nnum_processes: 8\ndeepspeed_config:\n"
                                      "  zero_stage: 2\n  zero3_init_flag: true\n")
    assert "deepspeed_config.zero3_init_flag" in [x.key for x in read(tmp_path / "on.yaml").ignored]


def test_explain_places_a_kill_just_after_the_trainers_save_line_at_the_save(tmp_path):
    from helpers import explain

    log = ("  10%|#   | 500/5000 [1:02:11<9:20:00, 7.4s/it]\n"
           "[INFO|trainer.py:3705] Saving model checkpoint to out/checkpoint-500\n"
           "[INFO] [launch.py:319:sigkill_handler] Killing subprocess 4101\nKilled\n")
    ex = explain.explain(log, "llama-3.1-8b", TrainSetup(strategy="zero2", gpus=8, gpu_gib=79.1, host_gib=100))
    assert ex.phase == "save"
    assert "OOM on HOST at the optimizer step, while the checkpoint is saved" in ex.text()
    assert "fewer GPUs per node (4 per node, 2 nodes)" in ex.ways_shown
    far = "Saving model checkpoint to out/checkpoint-500\n" + "step\n" * 30 + "Killed\n"     # a save long before
    assert explain.explain(far, "llama-3.1-8b", TrainSetup(strategy="zero2", gpus=8, gpu_gib=79.1,
                                                          host_gib=100), fixes=False).phase != "save"


@pytest.mark.parametrize("name,text", [
    ("ax.yaml", "base_model: meta-llama/Llama-3.1-8B\nfsdp_version: 2\nfsdp_config:\n  state_dict_type: {kind}\n"),
    ("ax.yaml", "base_model: meta-llama/Llama-3.1-8B\nfsdp_version: 2\nfsdp_config:\n  fsdp_state_dict_type: {kind}\n"),
    ("sft.yaml", "model_name_or_path: Qwen/Qwen2.5-7B\nfsdp: full_shard auto_wrap\nfsdp_config:\n  state_dict_type: {kind}\n"),
], ids=["axolotl", "axolotl-prefixed", "trl"])
def test_axolotl_and_trl_files_set_the_state_dict_type_too(tmp_path, name, text):
    """axolotl hands fsdp_config to accelerate's plugin (either key style); TRL's TrainingArguments read
    fsdp_config.state_dict_type (transformers training_args.py, FULL_STATE_DICT when unset)."""
    assert _read(tmp_path, name, text.format(kind="SHARDED_STATE_DICT")).sharded_save is True
    assert _read(tmp_path, name, text.format(kind="full_state_dict")).sharded_save is False
    with pytest.raises(InputError, match="state_dict_type must be FULL_STATE_DICT, SHARDED_STATE_DICT or "
                                         "LOCAL_STATE_DICT, got 'HALF'"):
        _read(tmp_path, name, text.format(kind="HALF"))


@pytest.mark.parametrize("name,text,key", [
    ("acc.yaml", "distributed_type: FSDP\nnum_processes: 8\nfsdp_config:\n  fsdp_version: 2\n"
                 "  fsdp_cpu_ram_efficient_loading: true\n", "fsdp_config.fsdp_cpu_ram_efficient_loading"),
    ("ax.yaml", "base_model: meta-llama/Llama-3.1-8B\nfsdp_version: 2\nfsdp_config:\n  cpu_ram_efficient_loading: true\n",
     "fsdp_config.cpu_ram_efficient_loading"),
], ids=["accelerate", "axolotl"])
def test_cpu_ram_efficient_loading_is_read_and_said_to_change_nothing(tmp_path, name, text, key):
    """transformers 5.23 converts the whole model on every rank with it (measured: test_loading's first test)."""
    from helpers import readers

    f = tmp_path / name
    f.write_text(text)
    got = readers.read([str(f)])
    entry = next(x for x in got.settings if x.key == key)
    assert entry.value is True and entry.sets == loading.ram_efficient_words(True) and not entry.fields
    assert key not in [x.key for x in got.ignored]
    f.write_text(text.replace("efficient_loading: true", "efficient_loading: false"))
    off = next(x for x in readers.read([str(f)]).settings if x.key == key)
    assert off.value is False and off.sets == "off: every rank converts"
    base = estimate.run("llama-3.1-8b", TrainSetup(strategy="fsdp2", gpus=8, precision="bf16-mixed"))
    assert estimate.run("llama-3.1-8b", got.setup.replace(precision="bf16-mixed", gpus=8, gpus_per_node=8)).host.phases["setup"] == \
        base.host.phases["setup"] == 8 * P8 * 4


def test_zero3_gathers_a_fused_experts_modules_parameters_together_at_the_save():
    """engine.py _zero3_consolidated_16bit_state_dict: GatheredParameters(list(module.parameters(recurse=False))):
    Qwen3-MoE's experts module holds gate_up_proj and down_proj, both on the GPU at once (DeepSpeed 0.19.8)."""
    m = models.spec("qwen3-30b-a3b")
    experts = [t.numel for t in m.tensors if t.name.startswith("model.layers.0.mlp.experts.")]
    assert len(experts) == 2 and saving.largest_module(m) == sum(experts) > max(t.numel for t in m.tensors)
    r = estimate.run(m, TrainSetup(strategy="zero3", gpus=8))
    assert _saving(r, "the largest module") == sum(experts) * 2


def test_cli_refuses_save_16bit_typed_for_another_engine(capsys):
    """--save-16bit is the default value: typed with ZeRO-2 it would be dropped silently, so it is refused in one line."""
    from helpers.__main__ import main

    assert main(["estimate", "--model", "llama-3.1-8b", "--strategy", "zero2", "--gpus", "8", "--save-16bit"]) == 2
    err = capsys.readouterr().err
    assert "--save-16bit (the whole 16-bit model gathered on rank 0 at a save) is a ZeRO-3 option" in err
    assert err.count("\n") == 1
    assert main(["estimate", "--model", "llama-3.1-8b", "--strategy", "zero3", "--gpus", "8", "--save-16bit"]) == 0


def test_a_run_that_saves_no_checkpoint_counts_no_save():
    setup = TrainSetup(strategy="zero2", gpus=8, host_gib=64)
    saving_run = estimate.run("llama-3.1-8b", setup)
    quiet = estimate.run("llama-3.1-8b", setup.replace(checkpoint_saves=False))
    assert saving_run.oom["device"] == "host" and quiet.oom["device"] is None
    assert not quiet.meta["saving"] and quiet.host.phases["step"] == 0
    assert "saving a checkpoint: not counted, the set-up saves none (checkpoint_saves false" in report.table(quiet)
    with pytest.raises(InputError, match="checkpoint_saves must be True or False, got 'no'"):
        TrainSetup(checkpoint_saves="no").validate()


@pytest.mark.parametrize("name,text,expect", [
    ("sft.yaml", "model_name_or_path: Qwen/Qwen2.5-7B\nsave_strategy: \"no\"\n", False),
    ("sft.yaml", "model_name_or_path: Qwen/Qwen2.5-7B\nsave_strategy: epoch\n", True),
    ("ax.yaml", "base_model: Qwen/Qwen2.5-7B\nsave_strategy: \"no\"\n", False),
    ("lf.yaml", "model_name_or_path: Qwen/Qwen2.5-7B\nstage: sft\ndo_train: true\nfinetuning_type: full\n"
                "save_strategy: \"no\"\n", False),
], ids=["trl-no", "trl-epoch", "axolotl-no", "llamafactory-no"])
def test_the_trainers_save_strategy_sets_checkpoint_saves(tmp_path, name, text, expect):
    assert _read(tmp_path, name, text).checkpoint_saves is expect


def test_a_bad_save_strategy_is_one_line(tmp_path):
    with pytest.raises(InputError, match="save_strategy must be no, steps, epoch or best .*got 'never'"):
        _read(tmp_path, "sft.yaml", "model_name_or_path: Qwen/Qwen2.5-7B\nsave_strategy: never\n")


TITAN = """[model]
name = "llama3"
flavor = "8B"
[training]
local_batch_size = 1
seq_len = 8192
[parallelism]
data_parallel_shard_degree = 8
[checkpoint]
{checkpoint}
"""


@pytest.mark.parametrize("checkpoint,saves,sharded", [
    ('folder = "checkpoint"', False, False),            # torchtitan's default: no checkpoint at all
    ("enable = false", False, False),
    ("enable = true", True, True),                          # DCP: each rank its own shard
    ("enable_checkpoint = true", True, True),               # the earlier spelling
], ids=["default", "off", "on", "on-old-name"])
def test_torchtitan_saves_only_with_checkpoint_enable_and_then_sharded(tmp_path, checkpoint, saves, sharded):
    s = _read(tmp_path, "t.toml", TITAN.format(checkpoint=checkpoint))
    assert (s.checkpoint_saves, s.sharded_save) == (saves, sharded)


def test_torchtitans_async_save_is_listed_as_not_modelled(tmp_path):
    from helpers import readers

    f = tmp_path / "t.toml"
    f.write_text(TITAN.format(checkpoint="enable = true\nasync_mode = \"async_with_pinned_mem\""))
    got = readers.read([str(f)])
    assert any(x.key == "checkpoint.async_mode" and "whole state dict" in x.why for x in got.not_modelled)


def test_a_sharded_load_holds_no_whole_copy_and_torchtitan_loads_so(tmp_path):
    """torchtitan builds the model on the meta device and each rank reads its own shards (train.py)."""
    setup = TrainSetup(strategy="fsdp2", gpus=8, precision="bf16-mixed")
    assert estimate.run("llama-3.1-8b", setup).host.phases["setup"] == 8 * P8 * 4          # from_pretrained's fp32
    assert estimate.run("llama-3.1-8b", setup.replace(sharded_load=True)).host.phases["setup"] == 0
    assert _read(tmp_path, "t.toml", TITAN.format(checkpoint="")).sharded_load is True
    with pytest.raises(InputError, match="sharded_load .* is a torch strategy's option"):
        TrainSetup(strategy="zero3", gpus=8, sharded_load=True).validate()


def test_a_bare_no_for_save_strategy_gets_the_hint(tmp_path):
    with pytest.raises(InputError, match="got False \\(YAML reads a bare no as false: write \"no\"\\)"):
        _read(tmp_path, "sft.yaml", "model_name_or_path: Qwen/Qwen2.5-7B\nsave_strategy: no\n")


def test_the_save_line_says_the_model_then_the_optimizer():
    line = report.saving_lines(estimate.run("llama-3.1-8b", TrainSetup(strategy="fsdp2", gpus=8)))[1]
    assert line.startswith("saving a checkpoint (after an optimizer step, counted in it): first the model, full model")
    assert "; then the optimizer, full optimizer state dict" in line and line.endswith("(one after the other: the "
                                                                                     "larger counts)")


@pytest.mark.parametrize("strategy", ["fsdp1", "fsdp2"])
def test_a_full_state_dict_save_gathers_offloaded_parameters_too(strategy):
    """FULL_STATE_DICT gathers the whole model onto rank 0's host whether the shards live on the GPU or, offloaded, on
    the host: the save's host item is the same (it once counted only GPU-resident parameters, and vanished)."""
    s = TrainSetup(strategy=strategy, gpus=4, gpus_per_node=4, seq=256)
    on_gpu = estimate.run("llama-3.2-1b", s)
    offloaded = estimate.run("llama-3.2-1b", s.replace(offload_optimizer=True, offload_params=True))
    name = "full model state dict on rank 0"
    size = lambda r: next(i["bytes"] for i in r.items if i["name"].startswith(name))
    assert size(offloaded) == size(on_gpu) > 0
