"""Hostile and mistaken input, second pass (one test per defect class found by a hostile user on the surfaces added
since the first): each bad input ends in one line naming the value and what is allowed, a value the tool itself reads
differently is read as the tool reads it, and the Python API raises InputError like the CLI."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from helpers.__main__ import main
from helpers.errors import InputError
from helpers.readers import ConfigError, read

AX = "base_model: meta-llama/Llama-3.1-8B\nadapter: qlora\nlora_r: 8\nlora_target_linear: true\nload_in_4bit: true\n"
OPENRLHF = ("deepspeed {launcher}--module openrlhf.cli.train_sft --pretrain meta-llama/Llama-3.1-8B "
            "--zero_stage {stage} --micro_train_batch_size {mb} --max_len 512 --bf16\n")


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def refused(files, *words: str) -> str:
    with pytest.raises(ConfigError) as e:
        read(files)
    msg = str(e.value)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, msg
    return msg


def fields(imported, *names):
    return tuple(getattr(imported.setup, n) for n in names)


# -- 1. alias bombs -------------------------------------------------------------------------------------------------

def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path):
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [{','.join(['*' + prev] * 9)}]")
    p = write(tmp_path, "bomb.yaml", "\n".join(lines) + "\nbase_model: *i\n")
    started = time.perf_counter()
    refused([p], "alias", "100,000")
    assert time.perf_counter() - started < 5


# -- 2. quoted booleans, read as the tools read them ------------------------------------------------------------------

@pytest.mark.parametrize("word,four", [("'false'", False), ("'no'", False), ("'true'", True), ("'Yes'", True)])
def test_axolotl_quoted_load_in_4bit(tmp_path, word, four):
    """A quoted 'false' is false: adapter qlora then stops axolotl ('Require cfg.load_in_4bit to be True for qlora')."""
    f = write(tmp_path, "q.yaml", AX.replace("load_in_4bit: true", f"load_in_4bit: {word}"))
    if four:
        assert read([f]).setup.base_weights is not None
    else:
        refused([f], "Require cfg.load_in_4bit")


def test_axolotl_quoted_lora_target_linear_false_takes_the_named_modules(tmp_path):
    text = AX.replace("lora_target_linear: true", "lora_target_linear: 'false'\nlora_target_modules: [q_proj, v_proj]")
    assert read([write(tmp_path, "q.yaml", text)]).setup.lora_targets == "q_proj,v_proj"


def test_trl_quoted_use_peft_false_is_full_fine_tuning(tmp_path):
    imp = read([write(tmp_path, "trl.yaml", "model_name_or_path: meta-llama/Llama-3.1-8B\nuse_peft: 'false'\n"
                                            "lora_r: 8\nper_device_train_batch_size: 1\n")])
    assert imp.setup.lora_rank is None


def test_an_unreadable_boolean_is_one_line(tmp_path):
    refused([write(tmp_path, "q.yaml", AX.replace("load_in_4bit: true", "load_in_4bit: 'maybe'"))],
            "load_in_4bit must be true or false", "'maybe'")


# -- 3. keys and shapes the tool itself refuses -------------------------------------------------------------------------

def test_a_misspelt_deepspeed_zero_key_is_refused_with_the_right_one(tmp_path):
    ds = write(tmp_path, "ds.json", json.dumps({"zero_optimization": {"stage": 3, "offload_optimzer": {"device": "cpu"}},
                                                "train_micro_batch_size_per_gpu": 1}))
    refused([ds], "zero_optimization.offload_optimzer", "did you mean zero_optimization.offload_optimizer")


def test_a_misspelt_deepspeed_offload_key_is_refused(tmp_path):
    ds = write(tmp_path, "ds.json", json.dumps({"zero_optimization": {"stage": 3, "offload_param": {"devise": "cpu"}}}))
    refused([ds], "zero_optimization.offload_param.devise", "device")


def test_the_known_zero_keys_are_deepspeeds_own():
    import deepspeed.runtime.zero.config as zc
    import deepspeed.runtime.zero.offload_config as oc

    from helpers.readers import deepspeed as reader

    f = zc.DeepSpeedZeroConfig.model_fields
    assert reader.ZERO_KEYS == set(f) | {v.alias for v in f.values() if v.alias}
    assert reader.OFFLOAD_OPTIMIZER_KEYS == set(oc.DeepSpeedZeroOffloadOptimizerConfig.model_fields)
    assert reader.OFFLOAD_PARAM_KEYS == set(oc.DeepSpeedZeroOffloadParamConfig.model_fields)


def test_bf16_and_fp16_both_on_is_refused_as_deepspeed_does(tmp_path):
    ds = write(tmp_path, "ds.json", json.dumps({"bf16": {"enabled": True}, "fp16": {"enabled": True},
                                                "zero_optimization": {"stage": 2}}))
    refused([ds], "cannot be simultaneously enabled")


def test_an_accelerate_key_accelerate_refuses(tmp_path):
    acc = write(tmp_path, "acc.yaml", "distributed_type: FSDP\nmixed_precison: bf16\nnum_processes: 2\n")
    refused([acc], "mixed_precison", "did you mean 'mixed_precision'")


@pytest.mark.parametrize("training", ['[[training]]\nlocal_batch_size = 1\n', 'training = "big"\n'])
def test_a_torchtitan_section_that_is_not_a_table(tmp_path, training):
    toml = write(tmp_path, "t.toml", training + '[model]\nname = "llama3"\nflavor = "8B"\n')
    refused([toml], "training must be a table")


# -- 4. shell scripts read as bash runs them --------------------------------------------------------------------------

def test_a_variable_reassigned_after_the_command_does_not_change_it(tmp_path):
    sh = write(tmp_path, "a.sh", "ZERO=2\n" + OPENRLHF.format(launcher="", stage="$ZERO", mb=1) + "ZERO=3\n")
    assert read([sh]).setup.strategy == "zero2"


def test_bash_defaults_are_expanded(tmp_path):
    sh = write(tmp_path, "a.sh", "MB=\n" + OPENRLHF.format(launcher="", stage="${ZERO:-3}", mb="${MB:-2}"))
    assert fields(read([sh]), "strategy", "batch") == ("zero3", 2)


def test_deepspeed_include_over_several_hosts_counts_every_gpu(tmp_path):
    sh = write(tmp_path, "a.sh", OPENRLHF.format(launcher="--include host1:0,1@host2:0,1,2 ", stage=2, mb=1))
    refused([sh], "128 with micro batch 1 on 5 GPU(s)", "multiple of 5")   # DeepSpeed's _batch_assertion, on 5 GPUs
    sh.write_text(sh.read_text().replace(" --bf16", " --bf16 --train_batch_size 120"))
    assert read([sh]).setup.gpus == 5


@pytest.mark.parametrize("stage,strategy", [("0", "ddp"), ("00", "ddp"), ("3", "zero3")])
def test_zero_stage_read_as_argparse_int(tmp_path, stage, strategy):
    assert read([write(tmp_path, "a.sh", OPENRLHF.format(launcher="", stage=stage, mb=1))]).setup.strategy == strategy


def test_a_negative_zero_stage_names_the_stages(tmp_path):
    refused([write(tmp_path, "a.sh", OPENRLHF.format(launcher="", stage="-1", mb=1))], "must be 0, 1, 2 or 3", "-1")


def test_an_abbreviated_flag_is_the_flag_argparse_takes_it_for(tmp_path):
    """argparse's allow_abbrev (on in every OpenRLHF parser): --micro_train_batch is --micro_train_batch_size."""
    text = OPENRLHF.format(launcher="", stage=2, mb=4).replace("--micro_train_batch_size", "--micro_train_batch")
    imp = read([write(tmp_path, "a.sh", text)])
    assert imp.setup.batch == 4
    assert any(s.key == "--micro_train_batch_size" and s.line == 1 for s in imp.settings)


def test_an_ambiguous_or_unknown_flag_is_refused_as_argparse_refuses_it(tmp_path):
    base = OPENRLHF.format(launcher="", stage=2, mb=1)
    refused([write(tmp_path, "a.sh", base.replace("--max_len", "--max"))], "ambiguous", "--max_len", "--max_epochs")
    refused([write(tmp_path, "b.sh", base.replace("--bf16", "--bf16 --micro_train_batch_sise 2"))],
            "--micro_train_batch_sise", "unrecognized arguments", "did you mean --micro_train_batch_size")


def test_a_word_after_a_switch_is_refused(tmp_path):
    """`--bf16 false`: --bf16 is store_true, so argparse stops at 'false' (it was read as bf16 on)."""
    refused([write(tmp_path, "a.sh", OPENRLHF.format(launcher="", stage=2, mb=1).replace("--bf16", "--bf16 false"))],
            "'false'", "--bf16 is a switch", "unrecognized arguments")


def test_a_flag_without_its_value_is_refused(tmp_path):
    refused([write(tmp_path, "a.sh", OPENRLHF.format(launcher="", stage=2, mb=1).replace("--max_len 512", "--max_len"))],
            "--max_len needs a value")


def test_a_variable_set_in_an_if_block_is_named_where_a_flag_uses_it(tmp_path):
    script = "if [ -n \"$BIG\" ]; then\n  MB=8\nelse\n  MB=1\nfi\n" + OPENRLHF.format(launcher="", stage=2, mb="$MB")
    refused([write(tmp_path, "a.sh", script)], "--micro_train_batch_size $MB", "MB='1' is inside an if/case/loop block")
    out = "OUT=$(pwd)/ckpt\n" + OPENRLHF.format(launcher="", stage=2, mb=1).replace("--bf16", "--bf16 --save_path $OUT")
    imp = read([write(tmp_path, "b.sh", out)])                     # a flag with no effect on memory: listed as written
    assert any(i.key == "--save_path" and i.value == "$OUT" for i in imp.ignored)


def test_array_appends_and_word_split_variables_are_read(tmp_path):
    script = ("ARGS=(--pretrain meta-llama/Llama-3.1-8B --zero_stage 2)\nARGS+=(--micro_train_batch_size 4)\n"
              "EXTRA=\"--max_len 1024 --bf16\"\n"
              "deepspeed --module openrlhf.cli.train_sft \"${ARGS[@]}\" $EXTRA\n")
    assert fields(read([write(tmp_path, "a.sh", script)]), "batch", "seq", "strategy") == (4, 1024, "zero2")


def test_an_env_prefix_is_not_an_assignment(tmp_path):
    script = "MB=2\nMB=8 echo hi\n" + OPENRLHF.format(launcher="", stage=2, mb="$MB")
    assert read([write(tmp_path, "a.sh", script)]).setup.batch == 2


@pytest.mark.parametrize("include", ["localhost:0-3", "localhost:0,1,", "localhost:a"])
def test_an_include_deepspeed_cannot_read_is_refused(tmp_path, include):
    refused([write(tmp_path, "a.sh", OPENRLHF.format(launcher=f"--include {include} ", stage=2, mb=1))],
            "--include", "as a number")


def test_an_include_naming_a_gpu_twice_counts_it_once(tmp_path):
    sh = write(tmp_path, "a.sh", OPENRLHF.format(launcher="--include localhost:0,1,1 ", stage=2, mb=1))
    assert read([sh]).setup.gpus == 2


def test_the_argparse_table_is_openrlhf_own(tmp_path):
    """data/tool_keys/openrlhf.json holds each module's flags; the ones the reader knows as switches are switches."""
    from helpers.readers import openrlhf

    for style in ("classic", "dotted"):
        for module in ("train_sft", "train_dpo", "train_rm", "train_ppo_ray"):
            table = openrlhf.argparse_flags(module, style)
            assert len(table) > 60
            for name in openrlhf.SWITCHES:
                flag = openrlhf.FLAGS[name][style == "dotted"]
                if flag in table:
                    assert table[flag]["switch"], (module, flag)


# -- 5. paths and the environment: one line, never a traceback ----------------------------------------------------------

def test_a_file_name_over_255_bytes(tmp_path):
    refused([tmp_path / ("a" * 300 + ".yaml")], "file name too long")


def test_a_loop_of_symbolic_links(tmp_path):
    os.symlink(tmp_path / "b.yaml", tmp_path / "a.yaml")
    os.symlink(tmp_path / "a.yaml", tmp_path / "b.yaml")
    refused([tmp_path / "a.yaml"], "a loop of symbolic links")


def test_a_companion_that_is_not_a_regular_file(tmp_path):
    refused([write(tmp_path, "ax.yaml", AX + "deepspeed: /dev/zero\n")], "'/dev/zero'", "not a regular file")


def test_a_save_path_over_255_bytes(tmp_path, capsys):
    code = main(["measure", "--model", "qwen2.5-0.5b", "--seq", "64", "--steps", "1",
                 "--save", str(tmp_path / ("b" * 300 + ".json"))])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "255 bytes" in err


def test_rank_not_a_number(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "abc")
    assert main(["estimate", "--model", "llama-3-8b"]) == 2
    assert "RANK='abc'" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["estimate", "fit", "fixes"])
def test_only_rank_0_answers(monkeypatch, capsys, command):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main([command, "--model", "llama-3-8b", "--gpu", "a100-80gb"]) == 0
    assert capsys.readouterr().out == ""


def test_a_leftover_rank_is_said_and_answered(monkeypatch, capsys):
    """RANK without a WORLD_SIZE above it (a SLURM or container shell's leftover): not a launcher's rank."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(["estimate", "--model", "llama-3-8b", "--gpu", "a100-80gb"]) == 0
    out = capsys.readouterr()
    assert "llama-3-8b" in out.out and "note: RANK=1 without a WORLD_SIZE" in out.err


# -- 5. the Python API ----------------------------------------------------------------------------------------------------

def test_read_without_paths():
    with pytest.raises(InputError, match="config file paths"):
        read(None)


def test_explorer_with_a_dict():
    from helpers import explore

    with pytest.raises(InputError, match="TrainSetup"):
        explore.explorer("llama-3-8b", {"batch": 2})


def test_explorer_set_batch_0_is_refused_not_clamped():
    from helpers import explore
    from helpers.training import TrainSetup

    x = explore.explorer("llama-3-8b", TrainSetup(gpu_gib=80, batch=2))
    x.set(batch=0)                                   # said as the explorer says any invalid set-up: not clamped to 1
    assert "batch must be a positive integer, got 0" in x.error and "not a valid set-up" in x.verdict.value
    assert x.setup.batch == 2 and x.controls["batch"].value == 2


def test_plots_with_an_unknown_device_or_a_non_result():
    from helpers import estimate, plots

    r = estimate.run("llama-3-8b")
    with pytest.raises(InputError, match="device must be one of gpu, host"):
        plots.compare_bars({"a": r}, device="tpu")
    with pytest.raises(InputError, match="Result"):
        plots.memory_curve("x")


# -- 6. messages that name the problem ------------------------------------------------------------------------------------

def test_a_number_of_5000_digits(tmp_path):
    big = "9" * 5000
    refused([write(tmp_path, "b.yaml", f"base_model: meta-llama/Llama-3.1-8B\nmicro_batch_size: {big}\n")],
            "a number too long")
    refused([write(tmp_path, "b.json", f'{{"train_micro_batch_size_per_gpu": {big}}}')], "a number too long")


def test_a_key_that_is_a_number(tmp_path):
    refused([write(tmp_path, "k.yaml", "base_model: meta-llama/Llama-3.1-8B\n1: 2\n")], "key '1' at line 2")


# -- 7. figures -----------------------------------------------------------------------------------------------------------

def test_auto_buckets_follow_the_model_given_beside_the_files(tmp_path):
    write(tmp_path, "ds.json", json.dumps({"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
                                                                       "stage3_prefetch_bucket_size": "auto"},
                                                "train_micro_batch_size_per_gpu": "auto"}))
    ax = write(tmp_path, "ax.yaml", "base_model: meta-llama/Llama-3.2-1B\ndeepspeed: ds.json\nmicro_batch_size: 1\n")
    assert read([ax]).setup.reduce_bucket_size == 2048 ** 2
    assert read([ax], model="llama-3.1-70b").setup.reduce_bucket_size == 8192 ** 2


def test_fit_with_context_parallel_searches_its_multiples():
    from helpers import fit
    from helpers.training import TrainSetup

    f = fit.largest("llama-3.1-8b", TrainSetup(strategy="fsdp2", gpus=6, context_parallel=3, seq=768, gpu_gib=79),
                    "seq")
    assert f.step == 192 and f.value % 192 == 0 and f.value > 0


# -- 8. the saved result carries its evidence ---------------------------------------------------------------------------

def test_a_saved_result_has_the_evidence_json_prints(tmp_path, capsys):
    path = tmp_path / "r.json"
    assert main(["measure", "--mode", "dry-run", "--model", "qwen2.5-0.5b", "--seq", "64", "--no-progress",
                 "--save", str(path)]) == 0
    saved = json.loads(path.read_text())
    assert saved["evidence"]["kind"] and saved["evidence"]["detail"]


def test_a_value_quoted_in_an_error_is_cut_to_a_line(tmp_path):
    deep = "{a: " * 300 + "1" + "}" * 300
    msg = refused([write(tmp_path, "d.yaml", f"base_model: meta-llama/Llama-3.1-8B\nmicro_batch_size: {deep}\n")],
                  "micro_batch_size", "characters in all")
    assert len(msg) < 500 + len(str(tmp_path)) + 20


# -- a hostile pass over the fixes above found these ------------------------------------------------------------------

B = "base_model: Qwen/Qwen3-0.6B\nmicro_batch_size: 2\nsequence_len: 1024\nbf16: true\n"


def test_save_never_replaces_a_pipe(tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert main(["measure", "--model", "qwen2.5-0.5b", "--seq", "64", "--steps", "1", "--save", str(fifo)]) == 2
    assert "regular file" in capsys.readouterr().err and not fifo.is_file() and fifo.exists()


def test_a_value_that_contains_itself(tmp_path):
    refused([write(tmp_path, "s.yaml", B + "x: &r [*r]\n")], "contains itself through an alias")


def test_a_model_name_over_255_bytes(capsys):
    assert main(["estimate", "--model", "x" * 300]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "255 bytes" in err


@pytest.mark.parametrize("name", ["RTX 4090 Laptop GPU", "NVIDIA GeForce RTX 3060 Laptop GPU", "RTX 3060 Ti"])
def test_a_laptop_or_ti_card_is_not_taken_for_the_desktop_preset(capsys, name):
    assert main(["estimate", "--model", "qwen3-0.6b", "--gpu", name]) == 2
    assert "a different card from every preset" in capsys.readouterr().err


@pytest.mark.parametrize("key,field,normal", [("fp16", "precision", "bf16-mixed"), ("bfloat16", "precision", "bf16-mixed"),
                                              ("flash_attention", "attention", "sdpa"), ("reward_model", "batch", 2)])
@pytest.mark.parametrize("word", ['"false"', "'no'", "'off'", "'0'"])
def test_axolotl_reads_quoted_booleans_as_pydantic_does(tmp_path, key, field, normal, word):
    assert getattr(read([write(tmp_path, "q.yaml", B + f"{key}: {word}\n")]).setup, field) == normal


def test_rank_below_0(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "-1")
    assert main(["estimate", "--model", "qwen3-0.6b"]) == 2
    assert ">= 0" in capsys.readouterr().err


def test_a_superscript_digit_names_its_key(tmp_path):
    sh = write(tmp_path, "a.sh", OPENRLHF.format(launcher="", stage=2, mb=1).replace("--max_len 512", "--max_len ²"))
    refused([sh], "--max_len", "'²'")


def test_trl_beta_and_vllm_share_are_named(tmp_path):
    grpo = "model_name_or_path: Qwen/Qwen3-0.6B\nper_device_train_batch_size: 2\nnum_generations: 4\n"
    refused([write(tmp_path, "g.yaml", grpo + "beta: abc\n")], "beta 'abc'", "invalid float value")
    refused([write(tmp_path, "g.yaml", grpo + "use_vllm: true\nvllm_gpu_memory_utilization: abc\n")],
            "vllm_gpu_memory_utilization")


@pytest.mark.parametrize("key", ["cutoff_length", "per_device_batch_size", "lora_dim", "ds_config"])
def test_llamafactory_refuses_every_key_its_arguments_lack(tmp_path, key):
    base = (Path(__file__).parent / "data" / "configs_upstream" / "llamafactory" / "examples" / "train_lora" /
            "qwen3_lora_sft.yaml").read_text()
    refused([write(tmp_path, "lf.yaml", base + f"{key}: 8\n")], f"unknown key {key!r}", "ALLOW_EXTRA_ARGS")


def test_the_llamafactory_keys_hold_every_key_of_its_upstream_examples():
    from helpers.readers.llamafactory import known_keys

    for path in (Path(__file__).parent / "data" / "configs_upstream" / "llamafactory").rglob("*.yaml"):
        assert set(json.loads(json.dumps(__import__("yaml").safe_load(path.read_text())))) <= known_keys(), path


def test_torchtune_quoted_false_is_refused_because_torchtune_reads_it_as_true(tmp_path):
    text = (Path(__file__).parent / "data" / "configs_upstream" / "torchtune" / "recipes" / "configs" / "llama3_2" /
            "1B_lora_single_device.yaml").read_text()
    import re

    text = re.sub(r"(?m)^enable_activation_checkpointing: .*$", "enable_activation_checkpointing: 'false'", text)
    refused([write(tmp_path, "tt.yaml", text)], "enable_activation_checkpointing", "reads as true")


def test_a_nested_key_that_is_a_number_is_named(tmp_path):
    refused([write(tmp_path, "k.yaml", "base_model: Qwen/Qwen3-0.6B\nfsdp_version: 2\nfsdp_config:\n  1: 2\n")],
            "key '1' under fsdp_config at line 4")


def test_trl_reads_quoted_values_as_its_argparse_does(tmp_path):
    """TrlParser makes the YAML's values argparse defaults, which argparse converts with the field's type: a quoted
    'false' is False, '1' is 1; a null bool is None, which the Trainer takes as off; a null batch size fails."""
    base = "model_name_or_path: meta-llama/Llama-3.1-8B\n"
    s = read([write(tmp_path, "a.yaml", base + "gradient_checkpointing: 'false'\nper_device_train_batch_size: '2'\n"
                                            "use_peft: 'yes'\nlora_r: '8'\n")]).setup
    assert (s.checkpointing, s.batch, s.lora_rank) == ("none", 2, 8)
    assert read([write(tmp_path, "b.yaml", base + "gradient_checkpointing: null\n")]).setup.checkpointing == "none"
    refused([write(tmp_path, "c.yaml", base + "per_device_train_batch_size: null\n")], "is null")
    refused([write(tmp_path, "d.yaml", base + "per_device_train_batch_size: 'two'\n")], "invalid int value")
    refused([write(tmp_path, "e.yaml", base + "dtype: 1.5\n")], "dtype must be auto, bfloat16, float16 or float32")


def test_a_lone_deepspeed_file_sizes_its_auto_buckets_by_the_model_given(tmp_path):
    ds = {"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto"}}
    imp = read([write(tmp_path, "z.json", json.dumps(ds))], model="llama-3.2-1b")
    assert imp.setup.reduce_bucket_size == 2048 ** 2
    assert not any(n.key == "zero_optimization.reduce_bucket_size" for n in imp.not_modelled)


TITAN = '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 2\nseq_len = 2048\n'


@pytest.mark.parametrize("extra,words", [
    ("local_batch_sizes = 8\n", ["training.local_batch_sizes", "Invalid field names", "did you mean training.local_batch_size"]),
    ("[trainning]\nsteps = 10\n", ["trainning is not a torchtitan setting", "did you mean training"]),
    ("enable_cpu_offload = \"false\"\n", ["training.enable_cpu_offload must be true or false", "non-empty text is true"]),
    ("steps = \"10\"\n", ["training.steps must be a number"]),
])
def test_torchtitan_refuses_what_its_config_manager_refuses(tmp_path, extra, words):
    """torchtitan's ConfigManager (config/manager.py @238fa99) refuses a key its JobConfig lacks, at every level, and
    passes values on as written; data/tool_keys/torchtitan.json holds JobConfig's fields."""
    refused([write(tmp_path, "t.toml", TITAN + extra)], *words)


def test_an_earlier_torchtitan_file_keeps_its_unknown_keys(tmp_path):
    """The October 2024 config_manager merged a TOML into its defaults and kept any key: listed as ignored."""
    old = '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nbatch_size = 2\nseq_len = 2048\nwhatever = 1\n'
    imp = read([write(tmp_path, "t.toml", old)])
    assert imp.setup.batch == 2 and any(i.key == "training.whatever" for i in imp.ignored)


def test_odd_names_and_sizes_get_one_clear_line(tmp_path, capsys):
    with pytest.raises(InputError, match="an empty file name"):
        read([""])
    with pytest.raises(ConfigError) as e:
        read([tmp_path / "x\nyaml"])
    assert "\n" not in str(e.value) and "'" in str(e.value)
    many = write(tmp_path, "many.yaml", "".join(f"k{i}: 1\n" for i in range(60000)))
    msg = refused([many], "it holds 120,001 values")
    assert "alias" not in msg
    assert main(["estimate", "--model", "llama-3.2-1b", "--versions", "transformers=" + "9" * 4400]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a release number" in err


def test_axolotl_values_as_its_pydantic_schema_reads_them(tmp_path):
    base = "base_model: meta-llama/Llama-3.2-1B\n"
    refused([write(tmp_path, "a.yaml", base + "flash_attention: [1, 2]\n")], "flash_attention must be true or false")
    refused([write(tmp_path, "b.yaml", base + "bf16: {x: 1}\n")], "bf16 must be true or false or 'auto'")
    assert read([write(tmp_path, "c.yaml", base + "micro_batch_size: 4.0\n")]).setup.batch == 4
    assert read([write(tmp_path, "d.yaml", base + "flash_attention: 1\n")]).setup.attention == "flash"


@pytest.mark.parametrize("script,batch", [
    ("MB='4' ; LEN=512\n", 4), ("MB=4; echo done\n", 4), ("MB=2 A=3\n", 2), ("MB=16 python x.py\n", 5),
    ("declare -i MB=3\n", 3), ("MB=6  # micro\n", 6),
])
def test_assignments_read_as_bash_runs_them(tmp_path, script, batch):
    text = "MB=5\n" + script + OPENRLHF.format(launcher="", stage=2, mb="$MB")
    assert read([write(tmp_path, "a.sh", text)]).setup.batch == batch


def test_a_one_line_if_and_an_unset_variable_are_named(tmp_path):
    one = "if [ -n \"$X\" ]; then MB=8; else MB=1; fi\n" + OPENRLHF.format(launcher="", stage=2, mb="$MB")
    refused([write(tmp_path, "a.sh", one)], "inside an if/case/loop block")
    refused([write(tmp_path, "b.sh", OPENRLHF.format(launcher="", stage=2, mb="$MBS"))], "$MBS is not assigned")


def test_a_comment_line_ends_a_continued_command(tmp_path):
    """bash: a comment line ends the command continued onto it; the lines after it are other commands."""
    text = ("deepspeed --module openrlhf.cli.train_sft --pretrain meta-llama/Llama-3.1-8B \\\n"
            "  --micro_train_batch_size 2 \\\n  # --gradient_checkpointing \\\n  --micro_train_batch_size 9\n")
    assert read([write(tmp_path, "a.sh", text)]).setup.batch == 2


def test_an_echoed_or_longer_module_name_is_not_the_command(tmp_path):
    text = "echo openrlhf.cli.train_sft --micro_train_batch_size 9\n" + OPENRLHF.format(launcher="", stage=2, mb=3)
    assert read([write(tmp_path, "a.sh", text)]).setup.batch == 3
    refused([write(tmp_path, "b.sh", OPENRLHF.format(launcher="", stage=2, mb=3).replace("train_sft", "train_sft.x"))],
            "not a config this package reads")


def test_a_negative_word_after_a_flag_says_how_to_write_it(capsys):
    assert main(["estimate", "--model", "llama-3.2-1b", "--batch", "-inf"]) == 2
    assert "write --batch=-inf" in capsys.readouterr().err


def test_a_near_miss_of_an_identifying_key_is_named(tmp_path):
    refused([write(tmp_path, "a.yaml", "base-model: meta-llama/Llama-3.2-1B\nmicro_batch_size: 2\n")],
            "base-model looks like base_model (axolotl)")


def test_torchtune_optimizer_arguments_are_the_classes_own(tmp_path):
    src = (Path(__file__).parent / "data" / "configs_upstream" / "torchtune" / "recipes" / "configs" / "llama3_2" /
           "1B_lora_single_device.yaml").read_text()
    assert "fused: True" in src
    refused([write(tmp_path, "t.yaml", src.replace("fused: True", "fusd: True"))], "optimizer.fusd",
            "AdamW takes no argument 'fusd'", "did you mean optimizer.fused")


def test_torchrun_every_gpu_is_no_count(tmp_path):
    text = ("torchrun --nproc-per-node gpu --nnodes 1:4 -m openrlhf.cli.train_sft --pretrain "
            "meta-llama/Llama-3.1-8B --bf16\n")
    imp = read([write(tmp_path, "a.sh", text)])
    assert imp.setup.gpus == 1 and any(d.key == "gpus" for d in imp.defaults)
    assert any(n.key == "--nproc-per-node" and "give --gpus" in n.why for n in imp.not_modelled)
    ex = read([write(tmp_path, "b.sh", OPENRLHF.format(launcher="--exclude localhost:0 ", stage=2, mb=1))])
    assert ex.setup.gpus == 1 and any(n.key == "--exclude" for n in ex.not_modelled)


def test_deepspeed_launcher_refuses_a_count_beside_a_filter(tmp_path):
    sh = write(tmp_path, "a.sh", OPENRLHF.format(launcher="--num_gpus 4 --exclude localhost:0 ", stage=2, mb=1))
    refused([sh], "Cannot specify num_nodes/gpus with include/exclude")


@pytest.mark.parametrize("script,batch", [
    (": <<'OLD'\ndeepspeed --module openrlhf.cli.train_sft --micro_train_batch_size 64\nOLD\n", 3),   # text, not run
    ("cat <<EOF\nMB=16\nEOF\n", 3),
    ("MB=7\nunset MB\nMB=3\n", 3),
    ("MB=1\nMB+=2\n", 12),
    ("EXTRA=\"\"\n", 3),
])
def test_heredocs_unset_and_appends_as_bash_runs_them(tmp_path, script, batch):
    text = "MB=3\n" + script + OPENRLHF.format(launcher="", stage=2, mb="$MB").replace("--bf16", "--bf16 $EXTRA")
    assert read([write(tmp_path, "a.sh", text)]).setup.batch == batch


@pytest.mark.parametrize("script,batch", [("false && MB=16\n", 3), ("true && MB=16\n", 16),
                                          ("f() {\n  MB=16\n}\n", 3), ("f() {\n  MB=16\n}\nf\n", 16)])
def test_an_assignment_bash_skips_is_skipped(tmp_path, script, batch):
    """bash skips `false && MB=16` and an uncalled function's body, and runs a called one."""
    text = "MB=3\n" + script + OPENRLHF.format(launcher="", stage=2, mb="$MB")
    assert read([write(tmp_path, "a.sh", text)]).setup.batch == batch


@pytest.mark.parametrize("script", ["mkdir -p out && MB=16\n", "[ -n \"$BIG\" ] && MB=16\n"])
def test_an_assignment_bash_may_skip_is_named(tmp_path, script):
    refused([write(tmp_path, "a.sh", "MB=3\n" + script + OPENRLHF.format(launcher="", stage=2, mb="$MB"))],
            "depends on how the script runs")


def test_a_command_among_others_on_its_line(tmp_path):
    text = "echo start; " + OPENRLHF.format(launcher="", stage=2, mb="${1:-4}").rstrip() + " 2>&1 | tee log\n"
    assert read([write(tmp_path, "a.sh", text)]).setup.batch == 4


def test_a_doubling_variable_stops_at_a_bound(tmp_path):
    lines = ["V0=ab"] + [f"V{i}=$V{i - 1}$V{i - 1}" for i in range(1, 40)]
    text = "\n".join(lines) + "\n" + OPENRLHF.format(launcher="", stage=2, mb=1)
    assert read([write(tmp_path, "a.sh", text)]).setup.batch == 1


def test_output_that_cannot_be_written_is_one_line():
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    for redirect in ("> /dev/full", ">&-"):
        r = subprocess.run(f"{sys.executable} -m helpers estimate --model llama-3.2-1b {redirect}", shell=True,
                           cwd=root, capture_output=True, text=True, timeout=300)
        assert r.returncode == 1 and r.stderr.strip().startswith("error: ") and "Traceback" not in r.stderr, redirect


def test_enum_typos_and_contradictions_the_tools_refuse(tmp_path):
    trl = "model_name_or_path: meta-llama/Llama-3.1-8B\n"
    refused([write(tmp_path, "a.yaml", trl + "optim: adamw_torhc\n")], "optim 'adamw_torhc'", "did you mean adamw_torch")
    refused([write(tmp_path, "b.yaml", trl + "bf16: true\nfp16: true\n")], "bf16 and fp16 are both true")
    assert any(n.key == "torch_dtype" and "dropped" in n.why            # TRL 1.x drops it: loads in float32
               for n in read([write(tmp_path, "c.yaml", trl + "torch_dtype: bfloat16\n")]).not_modelled)
    ax = "base_model: meta-llama/Llama-3.2-1B\nlora_r: 8\nlora_target_linear: true\n"
    refused([write(tmp_path, "d.yaml", ax + "adapter: lroa\n")], "adapter 'lroa' is none of axolotl's",
            "did you mean lora")


def test_gpu_names_one_card(tmp_path):
    from helpers import gpus

    for name in ("a100-80gb,a100-40gb", "h100-80gb h200"):
        with pytest.raises(InputError, match="names more than one"):
            gpus.canonical(name)
    assert gpus.canonical("NVIDIA A100-SXM4-80GB") == "a100-80gb"


def test_numbers_as_each_tool_reads_them(tmp_path):
    """argparse's int and pydantic's lax int take '+4' and '1_6'; axolotl's pydantic also '4.0'; torchtune keeps a
    quoted number a string (OmegaConf) and the recipe fails on it."""
    sh = write(tmp_path, "a.sh", OPENRLHF.format(launcher="", stage=2, mb="+4").replace("--max_len 512", "--max_len 1_024"))
    assert fields(read([sh]), "batch", "seq") == (4, 1024)
    ax = write(tmp_path, "b.yaml", "base_model: meta-llama/Llama-3.2-1B\nmicro_batch_size: '4.0'\n")
    assert read([ax]).setup.batch == 4
    src = (Path(__file__).parent / "data" / "configs_upstream" / "torchtune" / "recipes" / "configs" / "llama3_2" /
           "1B_lora_single_device.yaml").read_text()
    refused([write(tmp_path, "t.yaml", src.replace("batch_size: 4", "batch_size: '4'"))], "batch_size is the string '4'")


def test_accelerate_no_runs_one_process(tmp_path):
    """distributed_type NO: accelerate's launch_command runs simple_launcher, one process, whatever num_processes says
    (TRL ships such a file: accelerate_configs/single_gpu.yaml, num_processes 8)."""
    acc = write(tmp_path, "acc.yaml", "compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nnum_processes: 8\n"
                                      "mixed_precision: bf16\n")
    trl = write(tmp_path, "run.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\n")
    assert read([trl, acc]).setup.gpus == 1


def test_a_torchtitan_job_with_its_own_config_module_adds_fields(tmp_path):
    text = TITAN.replace("[model]", "[job]\ncustom_config_module = \"my.module\"\n[model]") + "[my_extra]\nx = 1\n"
    assert read([write(tmp_path, "t.toml", text)]).setup.batch == 2


def test_axolotl_lora_target_parameters_is_read_and_said(tmp_path):
    ax = ("base_model: mistralai/Mixtral-8x7B-v0.1\nadapter: lora\nlora_r: 8\nlora_dropout: 0\n"
          "lora_target_parameters:\n  - mlp.experts.gate_up_proj\n  - mlp.experts.down_proj\n")
    imp = read([write(tmp_path, "a.yaml", ax)])
    assert imp.setup.lora_targets == "all-linear"
    assert any(n.key == "lora_target_parameters" and "not modelled" in n.why for n in imp.not_modelled)


def test_a_long_version_is_cut(capsys):
    assert main(["estimate", "--model", "mixtral-8x7b", "--versions", "transformers=" + ".".join(["1"] * 3000)]) == 2
    assert len(capsys.readouterr().err) < 300


@pytest.mark.parametrize("script,gpus", [
    ("CUDA_VISIBLE_DEVICES=0,1 " + OPENRLHF.format(launcher="", stage=2, mb=1), 2),
    ("export CUDA_VISIBLE_DEVICES=0,1,2\n" + OPENRLHF.format(launcher="", stage=2, mb=1).replace(
        " --bf16", " --bf16 --train_batch_size 126"), 3),                   # (DeepSpeed refuses 128 on 3 GPUs)
    ("CUDA_VISIBLE_DEVICES=0,1 " + OPENRLHF.format(launcher="--num_gpus 4 ", stage=2, mb=1), 4),
])
def test_deepspeed_takes_cuda_visible_devices_as_its_include(tmp_path, script, gpus):
    """launcher/runner.py: CUDA_VISIBLE_DEVICES becomes --include localhost:<them>, unless a count or filter is given."""
    assert read([write(tmp_path, "a.sh", script)]).setup.gpus == gpus


@pytest.mark.parametrize("launcher,gpus", [
    ("deepspeed --num_gpu 4 --module", 4), ("deepspeed --inc localhost:0,1 --module", 2),
    ("torchrun --nproc_per 4 -m", 4),
])
def test_launcher_flags_abbreviated_as_their_argparse_takes_them(tmp_path, launcher, gpus):
    text = f"{launcher} openrlhf.cli.train_sft --pretrain meta-llama/Llama-3.1-8B --bf16\n"
    assert read([write(tmp_path, "a.sh", text)]).setup.gpus == gpus


@pytest.mark.parametrize("value,batch", [("${MB:0:1}", 4), ("${#MB}", 2), ("$((MB+1))", 43), ("${MB: -1}", 2),
                                         ("${MB%2}", 4), ("${X:-${MB}}", 42), ("$(( (MB + 6) / 8 ))", 6)])
def test_bash_expansions_are_evaluated_as_bash_does(tmp_path, value, batch):
    text = "MB=42\n" + OPENRLHF.format(launcher="", stage=2, mb=value)
    assert read([write(tmp_path, "a.sh", text)]).setup.batch == batch


@pytest.mark.parametrize("value", ["${MB/4/8}", "${!MB}", "$((MB++))"])
def test_a_bash_expansion_not_evaluated_is_named(tmp_path, value):
    refused([write(tmp_path, "a.sh", "MB=42\n" + OPENRLHF.format(launcher="", stage=2, mb=value))],
            "not evaluated here")


def test_llamafactory_quantised_base_without_lora_is_said_in_its_terms(tmp_path):
    lf = "model_name_or_path: meta-llama/Meta-Llama-3-8B\nstage: sft\nfinetuning_type: oft\nquantization_bit: 4\n"
    imp = read([write(tmp_path, "a.yaml", lf)])
    assert imp.setup.base_weights is None
    assert any(n.key == "quantization_bit" and "finetuning_type is not lora" in n.why for n in imp.not_modelled)


def test_a_command_run_by_bash_c_is_read(tmp_path):
    text = ('MB=2\nsrun --nodes 1 bash -c "deepspeed --module openrlhf.cli.train_sft --pretrain '
            'meta-llama/Llama-3.1-8B --bf16 --micro_train_batch_size $MB"\n')
    assert read([write(tmp_path, "a.sh", text)]).setup.batch == 2


def test_pass_five_reads(tmp_path):
    """Third hostile pass: a router alone bounds no rank; deepspeed's own launcher spellings; short LoRA names in a
    file refused (peft matches names as written); LLaMA-Factory's stage identifies its file; accelerate's
    distributed_type names; a continuation at the very end of a script."""
    from helpers import estimate
    from helpers.training import TrainSetup

    estimate.run("mixtral-8x7b", TrainSetup(lora_rank=8, lora_targets="gate", seq=256))
    ds = "deepspeed {} --module openrlhf.cli.train_sft --pretrain meta-llama/Llama-3.1-8B --bf16\n"
    assert read([write(tmp_path, "a.sh", ds.format("--num_accelerators 4"))]).setup.gpus == 4
    refused([write(tmp_path, "b.sh", ds.format("--num-gpus 4"))], "no flag --num-gpus", "did you mean --num_gpus")
    refused([write(tmp_path, "c.yaml", "base_model: meta-llama/Llama-3.2-1B\nadapter: lora\nlora_r: 8\n"
                                       "lora_target_modules: [q, v]\n")], "names 'q', 'v'", "write q_proj")
    refused([write(tmp_path, "d.sh", ds.format("").rstrip() + " --lora_rank 8 --target_modules q v\n")], "names 'q'")
    lf = read([write(tmp_path, "e.yaml", "model_name_or_path: meta-llama/Meta-Llama-3-8B\nstage: sft\n"
                                         "per_device_train_batch_size: 1\n")])
    assert lf.setup.lora_rank == 8                      # LLaMA-Factory's default finetuning_type lora, not TRL's full
    refused([write(tmp_path, "f.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\n"),
             write(tmp_path, "acc.yaml", "distributed_type: multi_gpu\nnum_processes: 2\n")],
            "distributed_type 'multi_gpu' is none of accelerate's", "did you mean 'MULTI_GPU'")
    eof = write(tmp_path, "g.sh", "deepspeed --module openrlhf.cli.train_sft --pretrain meta-llama/Llama-3.1-8B \\")
    assert read([eof]).setup.batch == 8


def test_torchtune_interpolations_resolve_as_omegaconf_does(tmp_path):
    src = (Path(__file__).parent / "data" / "configs_upstream" / "torchtune" / "recipes" / "configs" / "llama3_2" /
           "1B_lora_single_device.yaml").read_text()
    assert "  lora_rank: 64" in src
    imp = read([write(tmp_path, "a.yaml", src.replace("  lora_rank: 64", "  lora_rank: ${batch_size}"))])
    assert imp.setup.lora_rank == imp.setup.batch == 4
    refused([write(tmp_path, "b.yaml", src.replace("  lora_rank: 64", "  lora_rank: ${oc.env:RANK_R}"))],
            "an OmegaConf interpolation not resolved here")


# -- pass six (non-shell surfaces) ----------------------------------------------------------------------------------

TRL_MIN = "model_name_or_path: meta-llama/Llama-3.2-1B\nper_device_train_batch_size: 2\nmax_length: 1024\nbf16: true\n"
ACC_FSDP = "distributed_type: FSDP\nnum_processes: 4\nnum_machines: 1\nmixed_precision: bf16\nfsdp_config:\n"


@pytest.mark.parametrize("value,strategy", [(3, "ddp"), ("NO_SHARD", "ddp"), ("no_shard", "ddp"), (1, "fsdp1"),
                                            ("'1'", "fsdp1")])
def test_accelerate_sharding_strategy_as_accelerate_reads_it(tmp_path, value, strategy):
    """accelerate: a number is torch's ShardingStrategy value (3 is NO_SHARD), a name in any case."""
    acc = write(tmp_path, "acc.yaml", ACC_FSDP + f"  fsdp_sharding_strategy: {value}\n")
    assert read([write(tmp_path, "t.yaml", TRL_MIN), acc]).setup.strategy == strategy


@pytest.mark.parametrize("value", [9, "SHARD_ALL", 0])
def test_accelerate_refuses_a_sharding_strategy_it_does_not_have(tmp_path, value):
    acc = write(tmp_path, "acc.yaml", ACC_FSDP + f"  fsdp_sharding_strategy: {value}\n")
    refused([write(tmp_path, "t.yaml", TRL_MIN), acc], "fsdp_sharding_strategy", "3 NO_SHARD")


def test_transformers_fsdp_option_defaults_to_fsdp2_and_refuses_unknown_words(tmp_path):
    imp = read([write(tmp_path, "a.yaml", TRL_MIN + "fsdp: full_shard auto_wrap\n")])
    assert imp.setup.strategy == "fsdp2" and any(d.key == "fsdp_config.version" for d in imp.defaults)
    assert read([write(tmp_path, "b.yaml", TRL_MIN + "fsdp: full_shard\nfsdp_config:\n  version: 1\n")]
                ).setup.strategy == "fsdp1"
    refused([write(tmp_path, "c.yaml", TRL_MIN + "fsdp: shard_everything\n")], "'shard_everything'",
            "Unknown `fsdp` option")
    refused([write(tmp_path, "d.yaml", TRL_MIN + "fsdp: hybrid_shard\n")], "only available with FSDP1")


def test_pairs_the_tools_refuse(tmp_path):
    lf = "model_name_or_path: meta-llama/Llama-3.2-1B\nstage: sft\nfinetuning_type: lora\n"
    refused([write(tmp_path, "a.yaml", lf + "bf16: true\nfp16: true\n")], "bf16 and fp16 both true")
    refused([write(tmp_path, "b.yaml", TRL_MIN + "load_in_4bit: true\nload_in_8bit: true\n")],
            "4 bit precision at the same time")
    ax = "base_model: meta-llama/Llama-3.2-1B\nadapter: qlora\nlora_r: 8\nlora_target_linear: true\n"
    refused([write(tmp_path, "c.yaml", ax)], "Require cfg.load_in_4bit")
    refused([write(tmp_path, "d.yaml", ax + "load_in_8bit: true\n")], "Can't load qlora in 8bit")


def test_llamafactory_megatron_keys_v1_files_and_typos_are_named(tmp_path):
    lf = "model_name_or_path: meta-llama/Llama-3.2-1B\nstage: sft\nfinetuning_type: full\n"
    refused([write(tmp_path, "a.yaml", lf + "tensor_model_parallel_size: 2\n")], "Megatron setting", "USE_MCA=1")
    refused([write(tmp_path, "b.yaml", lf.replace("model_name_or_path", "model_name_or_pat"))],
            "'model_name_or_pat'", "did you mean 'model_name_or_path'")
    v1 = "model: Qwen/Qwen3-0.6B\nmodel_class: llm\ndist_config:\n  name: fsdp2\nmicro_batch_size: 2\ncutoff_len: 2048\n"
    refused([write(tmp_path, "c.yaml", v1)], "LLaMA-Factory v1 config")


@pytest.mark.parametrize("key", ["dtype", "gradient_accumulation_steps", "resume_from_checkpoint"])
def test_torchtune_keys_its_recipes_read_as_attributes_are_required(tmp_path, key):
    src = (Path(__file__).parent / "data" / "configs_upstream" / "torchtune" / "recipes" / "configs" / "llama3_2" /
           "1B_lora_single_device.yaml").read_text()
    lines = [ln for ln in src.splitlines() if not ln.startswith(key + ":")]
    assert len(lines) == len(src.splitlines()) - 1
    refused([write(tmp_path, "a.yaml", "\n".join(lines) + "\n")], f"no {key}", "Missing key")


def test_a_torchtune_lora_file_on_several_gpus(capsys):
    f = (Path(__file__).parent / "data" / "configs_upstream" / "torchtune" / "recipes" / "configs" / "llama3_2" /
         "1B_lora_single_device.yaml")
    assert main(["estimate", "--from", str(f), "--gpus", "2", "--offline"]) == 0
    assert "fsdp2 on 2 GPU(s)" in capsys.readouterr().out


def test_fits_with_a_gpu_leaves_the_result_as_it_was():
    from helpers import estimate, fit
    from helpers.training import TrainSetup

    r = estimate.run("llama-3.2-1b", TrainSetup(gpu_gib=80, seq=256))
    before = dict(r.meta)
    with pytest.raises(InputError):
        fit.fits(r, "nope-gpu")
    fit.fits(r, "h100-80gb")
    assert r.meta == before and fit.fits(r)[0]


def test_plots_name_a_missing_result_or_a_wrong_title():
    from helpers import estimate, plots
    from helpers.training import TrainSetup

    r = estimate.run("llama-3.2-1b", TrainSetup(seq=256))
    for call in (lambda: plots.memory_curve(None), lambda: plots.memory_curve(r, title=5),
                 lambda: plots.memory_curve(r, reported="x"), lambda: plots.compare_bars({"a": None}),
                 lambda: plots.sweep([1, 2], [r, None], "batch")):
        with pytest.raises(InputError):
            call()


def test_llamafactory_quantisation_it_refuses(tmp_path):
    lf = "model_name_or_path: meta-llama/Llama-3.2-1B\nstage: sft\n"
    refused([write(tmp_path, "a.yaml", lf + "finetuning_type: full\nquantization_bit: 4\n")],
            "only compatible with the LoRA or OFT method")
    refused([write(tmp_path, "b.yaml", lf + "finetuning_type: lora\nquantization_bit: 3\n")],
            "Bitsandbytes only accepts 4-bit or 8-bit")


def test_one_string_target_is_a_regular_expression_to_peft(tmp_path):
    """peft full-matches one string against whole module names: 'q_proj' matches nothing; TRL turns a one-name list
    into that string (ModelConfig.__post_init__)."""
    ax = "base_model: meta-llama/Llama-3.2-1B\nadapter: lora\nlora_r: 8\n"
    refused([write(tmp_path, "a.yaml", ax + "lora_target_modules: q_proj\n")], "one string 'q_proj'",
            "NoMatchingPeftModuleError")
    trl = TRL_MIN + "use_peft: true\n"
    refused([write(tmp_path, "b.yaml", trl + "lora_target_modules: [q_proj]\n")], "TRL turns a one-name list")
    imp = read([write(tmp_path, "c.yaml", trl + "lora_target_modules: '.*(q_proj|v_proj)'\n")])
    assert imp.setup.lora_targets == "q_proj,v_proj"


@pytest.mark.parametrize("targets", ["lm_head", "embed_tokens,q_proj"])
def test_lora_outside_the_decoder_layers_is_said_not_modelled(targets):
    from helpers import estimate
    from helpers.training import TrainSetup

    with pytest.raises(InputError, match="outside the decoder layers is not modelled"):
        estimate.run("llama-3.2-1b", TrainSetup(lora_rank=8, lora_targets=targets, seq=256))


def test_components_the_tools_cannot_build_are_refused(tmp_path):
    src = (Path(__file__).parent / "data" / "configs_upstream" / "torchtune" / "recipes" / "configs" / "llama3_2" /
           "1B_lora_single_device.yaml").read_text()
    assert "_component_: torch.optim.AdamW" in src
    refused([write(tmp_path, "a.yaml", src.replace("torch.optim.AdamW", "torch.optim.AdamWW"))],
            "torch.optim has no AdamWW", "did you mean torch.optim.AdamW")
    refused([write(tmp_path, "b.yaml", TRL_MIN + "attn_implementation: flashy\n")], "'flashy' is none transformers")
    refused([write(tmp_path, "c.yaml", "base_model: meta-llama/Llama-3.2-1B\ngradient_checkpointing: unsloth\n")],
            "'unsloth' was axolotl v0.6's")
    titan = (Path(__file__).parent / "data" / "configs_upstream" / "torchtitan")
    toml = next(p for p in sorted(titan.rglob("*.toml")) if 'name = "AdamW"' in p.read_text())
    refused([write(tmp_path, "d.toml", toml.read_text().replace('name = "AdamW"', 'name = "Lion"'))],
            "torchtitan builds Adam or AdamW only")


def test_messages_name_the_value(tmp_path, capsys):
    refused([write(tmp_path, "a.yaml", "checkpoint_dir: checkpoints/meta-llama/Llama-3.2-1B\nprecision: bf16-true\n"
                                       "lora_r: 8\ntrain: 5\n")], "train must be a mapping")
    assert main(["estimate", "--model", ""]) == 2 and "model is empty" in capsys.readouterr().err
    src = (Path(__file__).parent / "data" / "configs_upstream" / "torchtune" / "recipes" / "configs" / "llama3_2" /
           "1B_lora_single_device.yaml").read_text()
    refused([write(tmp_path, "t.yaml", src.replace("batch_size: 4", "batch_size: ${nope}", 1))],
            "interpolates nope, which the file does not have")


def test_the_notebook_api_names_wrong_arguments():
    from helpers import estimate, fit, fixes
    from helpers.training import TrainSetup

    for call in (lambda: fit.fits(None), lambda: fit.too_big("x"), lambda: fit.show({"a": 1}),
                 lambda: fit.check({"a": 1}), lambda: fit.table(None), lambda: fixes.table(None),
                 lambda: fixes.table(["x"]), lambda: fixes.pinned_bytes("x"), lambda: TrainSetup(tp=2),
                 lambda: fixes.ways_out("llama-3.2-1b", TrainSetup(gpu_gib=8), None, "x")):
        with pytest.raises(InputError):
            call()
    estimate.run("llama-3.2-1b", TrainSetup(seq=256))


def test_the_explorer_says_a_value_it_cannot_take():
    import matplotlib

    matplotlib.use("Agg")
    from helpers import explore
    from helpers.training import TrainSetup

    ex = explore.explorer("llama-3.2-1b", TrainSetup(gpu_gib=80, seq=256))
    ex.set(offload_ratio=2)
    assert "offload_ratio" in ex.verdict_text and ex.setup.offload_ratio is None
    with pytest.raises(InputError, match="grad_checkpointing must be True or False"):
        ex.set(grad_checkpointing="yes")


def test_torchtitan_selective_op_on_an_moe_is_estimated_as_an_upper_bound(tmp_path):
    src = (Path(__file__).parent / "data" / "configs_upstream" / "torchtitan" / "torchtitan" / "models" / "deepseek_v3" /
           "train_configs" / "deepseek_v3_16b.toml").read_text()
    assert 'flavor = "16B"' in src and "selective_ac_option = 'op'" in src
    imp = read([write(tmp_path, "a.toml", src.replace('flavor = "16B"', 'flavor = "671B"'))])
    assert imp.setup.checkpointing == "none"
    assert any(n.key == "activation_checkpoint.selective_ac_option" and "upper bound" in n.why
               for n in imp.not_modelled)


def test_a_torchtitan_section_from_a_job_module_says_where_it_is_named(tmp_path):
    toml = '[job]\ndump_folder = "x"\n[model]\nname = "llama3"\nflavor = "8B"\n[hf_transformers]\nmodel = "x"\n'
    refused([write(tmp_path, "a.toml", toml)], "hf_transformers is not a torchtitan setting", "custom_config_module")


# -- pass seven (non-shell surfaces) --------------------------------------------------------------------------------

DS_BF16 = {"bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": 2}


@pytest.mark.parametrize("zero,check", [
    ({"stage": 2, "cpu_offload": True}, lambda s: s.offload_optimizer and s.strategy == "zero2"),
    ({"stage": 3, "cpu_offload_param": True}, lambda s: s.offload_params),
    ({"stage": 3, "prefetch_bucket_size": 2000}, lambda s: s.prefetch_bucket_size == 2000),
    (True, lambda s: s.strategy == "zero1"),
])
def test_deepspeed_deprecated_and_own_names_read_as_deepspeed_reads_them(tmp_path, zero, check):
    """runtime/zero/config.py: cpu_offload -> offload_optimizer on the CPU, cpu_offload_param -> offload_param, a
    field's own name beside its stage3_ alias, and the legacy zero_optimization: true (stage 1)."""
    ds = write(tmp_path, "ds.json", json.dumps(DS_BF16 | {"zero_optimization": zero}))
    assert check(read([ds], model="llama-3.2-1b").setup)


def test_a_deepspeed_field_and_its_alias_together_are_named(tmp_path):
    ds = DS_BF16 | {"zero_optimization": {"stage": 3, "prefetch_bucket_size": 1, "stage3_prefetch_bucket_size": 2}}
    refused([write(tmp_path, "ds.json", json.dumps(ds))], "are one setting", "keep one")


def test_accelerate_fsdp2_reads_reshard_after_forward_alone(tmp_path):
    acc2 = ACC_FSDP + "  fsdp_version: 2\n"
    s = read([write(tmp_path, "t.yaml", TRL_MIN), write(tmp_path, "a.yaml", acc2 + "  fsdp_sharding_strategy: "
                                                                            "NO_SHARD\n")]).setup
    assert s.strategy == "fsdp2"                          # accelerate ignores the FSDP1 key under FSDP2
    refused([write(tmp_path, "t.yaml", TRL_MIN), write(tmp_path, "b.yaml", acc2 + "  fsdp_reshard_after_forward: "
                                                                              "FULL_SHARD\n")], "invalid truth value")


def test_accelerate_refuses_its_deepspeed_keys_beside_a_deepspeed_file(tmp_path):
    write(tmp_path, "ds.json", json.dumps(DS_BF16 | {"zero_optimization": {"stage": 3}}))
    acc = write(tmp_path, "a.yaml", "distributed_type: DEEPSPEED\nnum_processes: 4\ndeepspeed_config:\n"
                                    "  deepspeed_config_file: ds.json\n  zero_stage: 3\n")
    refused([write(tmp_path, "t.yaml", TRL_MIN), acc, tmp_path / "ds.json"], "deepspeed_config.zero_stage",
            "When using `deepspeed_config_file`")


def test_axolotl_values_its_schema_refuses(tmp_path):
    ax = "base_model: meta-llama/Llama-3.2-1B\nmicro_batch_size: 2\n"
    refused([write(tmp_path, "a.yaml", ax + "rl: dpoo\n")], "rl must be one of", "did you mean dpo")
    refused([write(tmp_path, "b.yaml", ax + "optimizer: adamw_torch_fuse\n")], "did you mean adamw_torch_fused")
    refused([write(tmp_path, "c.yaml", ax + "batch_size: 16\ngradient_accumulation_steps: 2\n")],
            "only one of gradient_accumulation_steps or batch_size")
    assert read([write(tmp_path, "d.yaml", ax + "optimizer: ao_adamw_8bit\n")]).setup is not None
    refused([write(tmp_path, "e.yaml", TRL_MIN + "load_in_4bit: true\nuse_peft: true\nbnb_4bit_quant_type: nf3\n")],
            "must be nf4 or fp4")


def test_a_trainers_deepspeed_train_batch_size_gives_the_world_size(tmp_path):
    write(tmp_path, "ds.json", json.dumps({"train_batch_size": 16, "zero_optimization": {"stage": 3}}))
    ax = "base_model: meta-llama/Llama-3.2-1B\nmicro_batch_size: 2\ngradient_accumulation_steps: 1\nbf16: true\n"
    assert read([write(tmp_path, "a.yaml", ax + "deepspeed: ds.json\n")]).setup.gpus == 8


def test_fit_boundary_names_wrong_arguments():
    from helpers import fit

    for args in (("x", 1, 10), (lambda k: True, "a", 10), (lambda k: True, 0, 10)):
        with pytest.raises(InputError):
            fit.boundary(*args)


# -- pass eight (non-shell surfaces) --------------------------------------------------------------------------------

def test_trl_activation_checkpointing_is_the_name_that_wins(tmp_path):
    """transformers 5 training_args.py: gradient_checkpointing is an alias, used only where activation_checkpointing
    is not set (TRL sets gradient_checkpointing: true by default)."""
    s = read([write(tmp_path, "a.yaml", TRL_MIN + "activation_checkpointing: false\n")]).setup
    assert s.checkpointing == "none"


def test_trl_bf16_weights_train_as_bf16_with_or_without_autocast(tmp_path):
    s = read([write(tmp_path, "a.yaml", TRL_MIN.replace("bf16: true", "bf16: false") + "dtype: bfloat16\n")]).setup
    assert s.precision == "bf16"


def test_trl_settings_its_trainer_refuses(tmp_path):
    refused([write(tmp_path, "a.yaml", TRL_MIN + "fsdp: full_shard\nfsdp_config:\n  activation_checkpointing: true\n")],
            "can't both be set to True")
    refused([write(tmp_path, "b.yaml", TRL_MIN + "env: 5\n")], "`env` field should be a dict")
    imp = read([write(tmp_path, "c.yaml", TRL_MIN.replace("max_length: 1024", "max_seq_length: 4096"))])
    assert imp.setup.seq == 4096 and any(n.key == "max_seq_length" and "drops it" in n.why for n in imp.not_modelled)


def test_accelerate_against_deepspeeds_train_batch_size_and_the_cpu(tmp_path):
    write(tmp_path, "ds.json", json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": "auto",
                                           "zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}}))
    acc = write(tmp_path, "a.yaml", "distributed_type: DEEPSPEED\nnum_processes: 4\ndeepspeed_config:\n"
                                    "  deepspeed_config_file: ds.json\n")
    refused([write(tmp_path, "t.yaml", TRL_MIN), acc, tmp_path / "ds.json"], "num_processes starts 4",
            "refuses the mismatch")
    cpu = write(tmp_path, "c.yaml", "distributed_type: MULTI_GPU\nnum_processes: 4\nuse_cpu: true\n")
    refused([write(tmp_path, "t.yaml", TRL_MIN), cpu], "use_cpu: true")


def test_deepspeed_autocast_sections_are_said_not_modelled(tmp_path):
    ds = write(tmp_path, "ds.json", json.dumps(DS_BF16 | {"torch_autocast": {"enabled": True}}))
    assert any(n.key == "torch_autocast" for n in read([ds], model="llama-3.2-1b").not_modelled)
