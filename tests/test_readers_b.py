"""Readers of axolotl YAML, torchtitan TOML and OpenRLHF command lines, and the case configs in data/configs: every key
each reader reads, each tool's defaults, settings listed as not modelled (never dropped), bad files as one-line errors
naming the file, and each case's config giving the estimate of `cases.setup(n)`."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from helpers import cases, estimate
from helpers.readers import ConfigError, openrlhf, read
from helpers.readers.provenance import GPUS_UNKNOWN_TOOL

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "data" / "configs"
PRESET = Path(__file__).resolve().parent / "data" / "readers" / "torchtitan_llama3_8b.toml"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(textwrap.dedent(text).lstrip("\n"))
    return p


def keyed(items) -> dict:
    return {x.key: x for x in items}


def one_line_error(excinfo, path: Path, *words: str) -> None:
    message = str(excinfo.value)
    assert "\n" not in message, message
    assert message.startswith(f"{path}: "), message
    for w in words:
        assert w in message, (w, message)


# --- torchtitan ----------------------------------------------------------------------------------------------------

def test_torchtitan_real_llama3_8b_preset_reads():
    """torchtitan's own llama3_8b.toml: FSDP2 over run_train.sh's 8 GPUs (dp_shard -1), op-level selective AC."""
    i = read(PRESET)
    assert i.format == "torchtitan" and i.model == "llama-3.1-8b" and i.model_named == "llama3 8B"
    s = i.setup
    assert (s.batch, s.seq, s.strategy, s.gpus, s.precision) == (1, 8192, "fsdp2", 8, "bf16-mixed")
    assert (s.checkpointing, s.adam_impl, s.attention, s.offload_params) == ("selective", "fused", "flash", False)
    settings, defaults = keyed(i.settings), keyed(i.defaults)
    assert settings["training.seq_len"].line == 35 and settings["training.seq_len"].value == 8192
    assert settings["activation_checkpoint.selective_ac_option"].sets == "checkpointing='selective'"
    assert defaults["NGPU"].value == 8 and "run_train.sh" in defaults["NGPU"].source
    assert defaults["optimizer.implementation"].value == "fused"
    ignored = keyed(i.ignored)
    assert "job.dump_folder" in ignored and "lr_scheduler.warmup_steps" in ignored and "metrics.log_freq" in ignored
    assert estimate.run(i.model, s).gpu.peak_bytes > 0


def test_torchtitan_every_key(tmp_path):
    p = write(tmp_path, "run.toml", """
        [model]
        name = "qwen3"
        flavor = "8B"
        converters = []
        [optimizer]
        name = "AdamW"
        implementation = "foreach"
        [training]
        local_batch_size = 2
        global_batch_size = 16
        seq_len = 4096
        dtype = "float32"
        mixed_precision_param = "float32"
        mixed_precision_reduce = "float32"
        enable_cpu_offload = true
        [parallelism]
        data_parallel_replicate_degree = 1
        data_parallel_shard_degree = 4
        tensor_parallel_degree = 1
        context_parallel_degree = 1
        pipeline_parallel_degree = 1
        disable_loss_parallel = false
        fsdp_reshard_after_forward = "default"
        [activation_checkpoint]
        mode = "full"
        [compile]
        enable = false
        [checkpoint]
        enable = true
    """)
    i = read(p)
    s = i.setup
    assert i.model == "qwen3-8b"
    assert (s.batch, s.seq, s.gpus, s.strategy, s.precision, s.adam_impl) == (2, 4096, 4, "fsdp2", "fp32", "foreach")
    assert (s.offload_optimizer, s.offload_params, s.pin_memory, s.checkpointing, s.grad_accum) == (True, True, True, "full", 2)
    settings = keyed(i.settings)
    for key in ("model.name", "model.flavor", "model.converters", "optimizer.name", "optimizer.implementation",
                "training.local_batch_size", "training.global_batch_size", "training.seq_len", "training.dtype",
                "training.mixed_precision_param", "training.mixed_precision_reduce", "training.enable_cpu_offload",
                "parallelism.data_parallel_replicate_degree", "parallelism.data_parallel_shard_degree",
                "parallelism.tensor_parallel_degree", "parallelism.context_parallel_degree",
                "parallelism.pipeline_parallel_degree", "parallelism.disable_loss_parallel",
                "parallelism.fsdp_reshard_after_forward", "activation_checkpoint.mode", "compile.enable",
                "checkpoint.enable"):
        assert key in settings, key
        assert settings[key].file == str(p) and settings[key].line is not None, key
    assert settings["training.global_batch_size"].sets == "grad_accum=2"
    assert not i.not_modelled and not i.ignored
    assert "NGPU" not in keyed(i.defaults)


def test_torchtitan_defaults(tmp_path):
    """A file that says almost nothing: job_config.py's defaults (local batch 8, seq 2048, selective AC every 2nd layer,
    fused AdamW) and run_train.sh's NGPU 8 apply, each as a Default naming torchtitan."""
    p = write(tmp_path, "min.toml", """
        [model]
        name = "llama3"
        flavor = "70B"
        [training]
        steps = 10
    """)
    i = read(p)
    s = i.setup
    assert i.model == "llama-3.1-70b"
    assert (s.batch, s.seq, s.gpus, s.strategy, s.adam_impl, s.precision) == (8, 2048, 8, "fsdp2", "fused",
                                                                              "bf16-mixed")
    defaults = keyed(i.defaults)
    for key in ("training.local_batch_size", "training.seq_len", "NGPU", "training.mixed_precision_param",
                "training.dtype",
                "activation_checkpoint.mode", "activation_checkpoint.selective_ac_option",
                "optimizer.implementation", "training.enable_cpu_offload"):
        assert key in defaults and "torchtitan" in defaults[key].tool, key
    assert defaults["activation_checkpoint.selective_ac_option"].value == "2"
    # torchtitan's default layer-level option: full checkpointing of every 2nd layer
    assert (s.checkpointing, s.checkpoint_every) == ("full", 2)
    assert "activation_checkpoint.selective_ac_option" not in keyed(i.not_modelled)
    assert defaults["activation_checkpoint.selective_ac_option"].sets.startswith("checkpointing='full', checkpoint_every=2")


def test_torchtitan_2024_keys_and_not_modelled(tmp_path):
    """The October 2024 spellings (training.batch_size, degrees under [training], experimental.*, optimizer.fused,
    [float8]); pipeline parallel, float8 and compile are listed, not dropped; HSDP and never-reshard are read."""
    p = write(tmp_path, "old.toml", """
        [model]
        name = "llama3"
        flavor = "405B"
        [optimizer]
        name = "AdamW"
        fused = true
        [training]
        batch_size = 1
        seq_len = 8192
        data_parallel_replicate_degree = 2
        data_parallel_shard_degree = 4
        tensor_parallel_degree = 1
        compile = true
        [experimental]
        pipeline_parallel_degree = 2
        [float8]
        enable_float8_linear = true
        [parallelism]
        fsdp_reshard_after_forward = "never"
        [activation_checkpoint]
        mode = "selective"
        selective_ac_option = "op"
    """)
    i = read(p)
    assert i.model is None and i.model_named == "llama3 405B"
    s = i.setup
    assert (s.batch, s.seq, s.adam_impl, s.checkpointing, s.strategy) == (1, 8192, "fused", "selective", "fsdp2")
    assert (s.gpus, s.dp_replicate, s.reshard_after_forward) == (16, 2, False)     # 2 x 4 x pp 2
    nm = keyed(i.not_modelled)
    assert nm["experimental.pipeline_parallel_degree"].value == 2
    assert nm["float8.enable_float8_linear"].value is True
    assert nm["training.compile"].value is True
    assert "parallelism.data_parallel_replicate_degree" not in nm and "parallelism.fsdp_reshard_after_forward" not in nm
    assert "HSDP" in keyed(i.settings)["parallelism.data_parallel_replicate_degree"].sets
    assert keyed(i.settings)["optimizer.fused"].sets == "adam_impl='fused'"


def test_torchtitan_parallel_degrees_modelled_or_listed(tmp_path):
    p = write(tmp_path, "tp.toml", """
        [model]
        name = "llama3"
        flavor = "8B"
        [training]
        local_batch_size = 1
        [parallelism]
        data_parallel_shard_degree = 2
        tensor_parallel_degree = 2
        context_parallel_degree = 2
    """)
    i = read(p)
    for field, key in (("tensor_parallel", "parallelism.tensor_parallel_degree"),
                       ("context_parallel", "parallelism.context_parallel_degree")):
        assert getattr(i.setup, field) == 2
    assert i.setup.gpus == 8


@pytest.mark.parametrize("body, words", [
    ("[training]\nlocal_batch_size = -4\n[model]\nname = 'llama3'\n", ("local_batch_size", "-4")),
    ("[training]\nseq_len = 2048\n[activation_checkpoint]\nmode = 'sometimes'\n", ("mode", "sometimes")),
    ("[training]\nseq_len = 2048\n[activation_checkpoint]\nmode = 'selective'\nselective_ac_option = 'x'\n",
     ("selective_ac_option", "'x'")),
    ("[training]\nseq_len = 2048\n[optimizer]\nimplementation = 'turbo'\n", ("implementation", "turbo")),
    ("[training]\nmixed_precision_param = 'float8'\n[model]\nname = 'llama3'\n", ("mixed_precision_param", "float8")),
    ("[training\nseq_len = 1\n", ("not valid TOML",)),
])
def test_torchtitan_bad_files(tmp_path, body, words):
    p = write(tmp_path, "bad.toml", body)
    with pytest.raises(ConfigError) as e:
        read(p)
    one_line_error(e, p, *words)


# --- OpenRLHF ------------------------------------------------------------------------------------------------------

CLASSIC = r"""
    set -x
    MODEL=meta-llama/Meta-Llama-3-8B
    deepspeed --num_gpus 4 --module openrlhf.cli.train_sft \
       --pretrain $MODEL \
       --max_len 4096 \
       --micro_train_batch_size 2 \
       --train_batch_size 64 \
       --zero_stage 2 \
       --bf16 \
       --flash_attn \
       --gradient_checkpointing \
       --adam_offload \
       --overlap_comm \
       --load_checkpoint \
       --packing_samples \
       --lora_rank 16 \
       --target_modules q_proj v_proj \
       --zpg 1 \
       --learning_rate 5e-6
"""


def test_openrlhf_classic_flags(tmp_path):
    p = write(tmp_path, "sft.sh", CLASSIC)
    i = read(p)
    s = i.setup
    assert i.format == "openrlhf" and i.model == "llama-3-8b" and i.model_named == "meta-llama/Meta-Llama-3-8B"
    assert (s.batch, s.seq, s.gpus, s.strategy, s.precision, s.attention) == (2, 4096, 4, "zero2", "bf16-mixed",
                                                                              "flash")
    assert ((s.checkpointing == "full"), s.offload_optimizer, s.pin_memory, s.overlap_comm, s.resume) == (
        True, True, True, True, True)
    assert (s.lora_rank, s.lora_targets, s.grad_accum) == (16, "q_proj,v_proj", 8)     # 64 // (2 x 4)
    settings = keyed(i.settings)
    for flag in ("--pretrain", "--max_len", "--micro_train_batch_size", "--train_batch_size", "--zero_stage", "--bf16",
                 "--flash_attn", "--gradient_checkpointing", "--adam_offload", "--overlap_comm", "--load_checkpoint",
                 "--packing_samples", "--lora_rank", "--target_modules", "--zpg", "launcher"):
        assert flag in settings, flag
    assert settings["--zero_stage"].line == 8 and settings["--zero_stage"].value == 2
    assert keyed(i.ignored)["--learning_rate"].value == "5e-6"
    assert "pin_memory" in keyed(i.defaults)["zero_optimization.offload_optimizer.pin_memory"].key


def test_openrlhf_dotted_flags_same_setup(tmp_path):
    """The current source's dotted flags give the same set-up as the classic ones."""
    dotted = r"""
        deepspeed --num_gpus 4 --module openrlhf.cli.train_sft \
           --model.model_name_or_path meta-llama/Meta-Llama-3-8B \
           --data.max_len 4096 \
           --train.micro_batch_size 2 \
           --train.batch_size 64 \
           --ds.zero_stage 2 \
           --ds.param_dtype bf16 \
           --ds.attn_implementation flash_attention_2 \
           --model.gradient_checkpointing_enable \
           --ds.adam_offload \
           --ds.overlap_comm \
           --ckpt.load_enable \
           --ds.packing_samples \
           --ds.lora.rank 16 \
           --ds.lora.target_modules q_proj v_proj \
           --ds.zpg 1 \
           --adam.lr 5e-6
    """
    a, b = read(write(tmp_path, "classic.sh", CLASSIC)), read(write(tmp_path, "dotted.sh", dotted))
    assert a.setup == b.setup
    assert "--ds.zero_stage" in keyed(b.settings) and "--adam.lr" in keyed(b.ignored)


def test_openrlhf_heredoc_script_and_defaults(tmp_path):
    """OpenRLHF's own example layout (read -r -d '' cmd <<EOF ... deepspeed --module $cmd): the dotted defaults of the
    current source apply to what it leaves out; no launcher count -> gpus 1 'not in the files'."""
    p = write(tmp_path, "train_sft.sh", r"""
        set -x
        read -r -d '' training_commands <<EOF
        openrlhf.cli.train_sft \
           --data.dataset Open-Orca/OpenOrca \
           --model.model_name_or_path Qwen/Qwen2.5-7B \
           --ds.zero_stage 2
        EOF
            # --ds.packing_samples
        if [[ ${1} != "slurm" ]]; then
            deepspeed --module $training_commands
        fi
    """)
    i = read(p)
    s = i.setup
    assert i.model == "qwen2.5-7b"
    assert (s.batch, s.seq, s.precision, s.attention, (s.checkpointing == "full"), s.grad_accum) == (
        8, 2048, "bf16-mixed", "flash", False, 16)
    defaults = keyed(i.defaults)
    assert defaults["gpus"].tool == GPUS_UNKNOWN_TOOL and "--gpus" in defaults["gpus"].source
    assert defaults["--train.micro_batch_size"].value == 8 and "3c3be623" in defaults["--train.micro_batch_size"].tool
    assert defaults["--ds.param_dtype"].value == "bf16"
    assert "--ds.packing_samples" not in keyed(i.settings)                  # a commented-out flag is not read


def test_openrlhf_classic_defaults_are_v085():
    """Classic flags without --bf16/--flash_attn: OpenRLHF v0.8.5's defaults, fp32 and eager attention."""
    i = openrlhf.read_command("deepspeed --include localhost:0,1 --module openrlhf.cli.train_sft --pretrain "
                              "Qwen/Qwen2.5-0.5B --train_batch_size 16")
    s = i.setup
    assert i.files == ["<command>"]
    assert (s.precision, s.attention, s.batch, s.seq, s.gpus, s.grad_accum) == ("fp32", "eager", 8, 2048, 2, 1)
    d = keyed(i.defaults)
    assert d["--bf16"].value is False and "v0.8.5" in d["--bf16"].tool
    assert d["--zero_stage"].value == 2 and s.strategy == "zero2"


def test_openrlhf_dpo_is_a_dpo_run_with_a_reference_copy(tmp_path):
    i = openrlhf.read_command(
        "deepspeed --num_gpus 8 --module openrlhf.cli.train_dpo --pretrain meta-llama/Meta-Llama-3-8B "
        "--micro_train_batch_size 2 --train_batch_size 32 --max_len 2048 --zero_stage 3 --bf16 --ref_offload "
        "--lora_rank 8", path=tmp_path / "dpo.txt")
    s = i.setup
    assert (s.run, s.batch, s.grad_accum) == ("dpo", 2, 2)   # 2 pairs (the estimate runs 4 sequences); 32 // (2 x 8)
    assert s.ref == "copy" and s.lora_rank == 8               # OpenRLHF loads a reference Actor even for LoRA
    assert i.files == [str(tmp_path / "dpo.txt")]
    assert "run=dpo, reference=copy" in keyed(i.settings)["--ref_pretrain"].sets
    assert "lower" in keyed(i.not_modelled)["--ref_offload"].why


def test_openrlhf_ppo_ray_actor(tmp_path):
    p = write(tmp_path, "ppo.sh", r"""
        ray job submit --address="http://127.0.0.1:8265" \
           --runtime-env-json='{"working_dir": "/openrlhf"}' \
           -- python3 -m openrlhf.cli.train_ppo_ray \
           --ref_num_nodes 1 \
           --vllm_num_engines 4 \
           --actor_num_nodes 2 \
           --actor_num_gpus_per_node 8 \
           --pretrain Qwen/Qwen2.5-72B-Instruct \
           --reward_pretrain OpenRLHF/Llama-3-8b-rm-mixture \
           --micro_train_batch_size 1 \
           --train_batch_size 128 \
           --prompt_max_len 1024 \
           --generate_max_len 3072 \
           --zero_stage 3 \
           --bf16 \
           --ring_attn_size 2 \
           --ds_tensor_parallel_size 1 \
           --zpg 8 \
           --load_in_4bit \
           --use_liger_kernel
    """)
    i = read(p)
    s = i.setup
    assert (s.gpus, s.gpus_per_node, s.seq, s.strategy) == (16, 8, 4096, "zero3")
    nm = keyed(i.not_modelled)
    assert nm["--zpg"].value == "8"
    assert "--use_liger_kernel" in nm and not s.fused_ce                # the Actor never calls the fused loss
    # the actor's step as OpenRLHF takes it; nothing else placed on its GPUs: the reference, the critic (gae: the
    # reward model's), the reward model and vLLM each on GPUs of their own
    assert (s.run, s.dpo_logps, s.ref, s.generation, s.completion) == ("grpo", "openrlhf", "none", "vllm-server", 3072)
    sets = {x.key: x.sets for x in i.settings}
    assert "own" in sets["--reward_pretrain"] and "own" in sets["--vllm_num_engines"]
    assert "critic model (gae)" not in nm and "processes sharing each GPU" not in nm
    assert s.context_parallel == 1 and "under zero3 is not modelled" in nm["--ring_attn_size"].why   # ring attention over ZeRO
    assert "--load_in_4bit" in nm and s.base_weights is None      # a 4-bit base under ZeRO is not modelled
    assert "--ref_num_nodes" in keyed(i.ignored)


@pytest.mark.parametrize("command, words", [
    ("--pretrain Qwen/Qwen2.5-7B --zero_stage 5", ("--zero_stage", "5")),
    ("--pretrain Qwen/Qwen2.5-7B --param_dtype fp8", ("--param_dtype", "fp8")),
    ("--pretrain Qwen/Qwen2.5-7B --attn_implementation magic", ("--attn_implementation", "magic")),
    ("--pretrain Qwen/Qwen2.5-7B --micro_train_batch_size -1", ("--micro_train_batch_size", "-1")),
    ("--pretrain Qwen/Qwen2.5-7B --lora_rank many", ("--lora_rank", "many")),
    ("--max_len 2048", ("names no model", "--pretrain")),
])
def test_openrlhf_bad_values(tmp_path, command, words):
    p = write(tmp_path, "bad.sh", f"deepspeed --module openrlhf.cli.train_sft {command}\n")
    with pytest.raises(ConfigError) as e:
        read(p)
    one_line_error(e, p, *words)


@pytest.mark.parametrize("flags, words", [
    ("--actor_num_nodes 1 --actor_num_gpus_per_node 8 --micro_train_batch_size 2 --train_batch_size 8",
     ("--train_batch_size 8", "micro batch 2 on 8 GPU(s)", "DeepSpeed refuses it", "= 0 steps", "multiple of 16")),
    ("--actor_num_nodes 1 --actor_num_gpus_per_node 8 --micro_train_batch_size 1 --train_batch_size 12",
     ("--train_batch_size 12", "with a remainder", "multiple of 8")),
    ("--actor_num_nodes 1 --actor_num_gpus_per_node 3 --micro_train_batch_size 1",
     ("--train_batch_size (default) 128", "on 3 GPU(s)", "multiple of 3")),
])
def test_openrlhf_train_batch_deepspeed_refuses(tmp_path, flags, words):
    """A train batch that is not micro batch x GPUs x whole accumulation steps stops at DeepSpeed's _batch_assertion
    before training: refused with DeepSpeed's reason, never read as one accumulation step."""
    p = write(tmp_path, "grpo.sh", f"python -m openrlhf.cli.train_ppo_ray --pretrain Qwen/Qwen2.5-7B "
                                   f"--vllm_num_engines 1 --zero_stage 3 {flags}\n")
    with pytest.raises(ConfigError) as e:
        read(p)
    one_line_error(e, p, *words)


def test_openrlhf_train_batch_not_refused_where_the_world_is_unknown_or_batches_are_bins(tmp_path):
    """Where the launcher does not say the world size (deepspeed without --num_gpus: every local GPU) or dynamic
    batching sets DeepSpeed's micro batch to 1 and accumulation to 1 (OpenRLHF 3c3be623 get_ds_train_config), the train
    batch is read as before."""
    i = read(write(tmp_path, "sft.sh", "deepspeed --module openrlhf.cli.train_sft --pretrain Qwen/Qwen2.5-7B "
                                       "--micro_train_batch_size 3 --train_batch_size 8\n"))
    assert i.setup.grad_accum == 2
    i = read(write(tmp_path, "dyn.sh", "python -m openrlhf.cli.train_ppo_ray --actor.model_name_or_path "
                                       "Qwen/Qwen2.5-7B --vllm.num_engines 1 --train.dynamic_batch_enable "
                                       "--train.micro_batch_size 3 --train.batch_size 8\n"))
    assert i.setup.strategy is not None


def test_openrlhf_packing_samples_turns_flash_attention_on(tmp_path):
    """OpenRLHF's classic CLIs set args.flash_attn = True when --packing_samples is given without it (8ff73978): read
    as flash attention from that default, not as eager."""
    for module, command in (
            ("train_sft", "deepspeed --num_gpus 8 --module openrlhf.cli.train_sft --micro_train_batch_size 1"),
            ("train_ppo_ray", "python -m openrlhf.cli.train_ppo_ray --vllm_num_engines 1 --micro_train_batch_size 1")):
        i = read(write(tmp_path, f"{module}.sh", f"{command} --pretrain Qwen/Qwen2.5-7B --packing_samples "
                                                  f"--train_batch_size 8\n"))
        assert i.setup.attention == "flash", module
        assert "--packing_samples" in keyed(i.defaults)["--flash_attn"].source
    i = read(write(tmp_path, "eager.sh", "python -m openrlhf.cli.train_ppo_ray --pretrain Qwen/Qwen2.5-7B "
                                         "--vllm_num_engines 1 --train_batch_size 32\n"))
    assert i.setup.attention == "eager"


def test_model_beside_the_files_wins_over_a_path_on_another_machine(tmp_path):
    """--model beside --from names the model where the file gives a path that exists only on the user's machine: the
    path is kept as the file's name for it, not refused."""
    p = write(tmp_path, "grpo.sh", "python -m openrlhf.cli.train_ppo_ray --pretrain /data/models/Qwen/Qwen2.5-7B-Instruct "
                                   "--vllm_num_engines 1\n")
    with pytest.raises(ConfigError) as e:
        read(p)
    one_line_error(e, p, "/data/models/Qwen/Qwen2.5-7B-Instruct", "no model config.json")
    i = read(p, model="Qwen/Qwen2.5-7B-Instruct")
    assert i.model is None and i.model_named == "/data/models/Qwen/Qwen2.5-7B-Instruct"


def test_openrlhf_unknown_model_is_named_not_guessed():
    i = openrlhf.read_command("python -m openrlhf.cli.train_sft --pretrain my-org/my-private-13b")
    assert i.model is None and i.model_named == "my-org/my-private-13b"


# --- axolotl -------------------------------------------------------------------------------------------------------

def test_axolotl_every_key(tmp_path):
    p = write(tmp_path, "run.yaml", """
        base_model: Qwen/Qwen2.5-7B-Instruct
        sequence_len: 8192
        micro_batch_size: 2
        gradient_accumulation_steps: 4
        bf16: true
        tf32: true
        gradient_checkpointing: true
        adapter: lora
        lora_r: 32
        lora_alpha: 16
        lora_target_modules: [q_proj, v_proj]
        optimizer: adamw_bnb_8bit
        flash_attention: true
        sample_packing: true
        plugins:
          - axolotl.integrations.liger.LigerPlugin
        liger_fused_linear_cross_entropy: true
        liger_rms_norm: true
        special_tokens:
          pad_token: <|endoftext|>
        learning_rate: 0.0002
        datasets:
          - path: tatsu-lab/alpaca
            type: alpaca
    """)
    i = read(p)
    s = i.setup
    assert i.format == "axolotl" and i.model == "qwen2.5-7b"
    assert (s.batch, s.seq, s.grad_accum, s.precision, (s.checkpointing == "full")) == (2, 8192, 4, "bf16-mixed", True)
    assert (s.lora_rank, s.lora_targets, s.optimizer, s.attention, s.fused_ce) == (32, "q_proj,v_proj", "adamw-8bit",
                                                                                 "flash", True)
    assert (s.strategy, s.gpus) == ("single", 1)
    settings = keyed(i.settings)
    for key in ("base_model", "sequence_len", "micro_batch_size", "gradient_accumulation_steps", "bf16", "tf32",
                "gradient_checkpointing", "adapter", "lora_r", "lora_target_modules", "optimizer", "flash_attention",
                "sample_packing", "plugins", "liger_fused_linear_cross_entropy"):
        assert key in settings and settings[key].line is not None, key
    assert settings["sequence_len"].line == 2
    assert keyed(i.not_modelled)["liger_rms_norm"].value is True
    ignored = keyed(i.ignored)
    for key in ("special_tokens", "learning_rate", "datasets", "lora_alpha"):
        assert key in ignored, key


def test_axolotl_defaults(tmp_path):
    """axolotl 0.18's schema defaults: sequence_len 512, micro batch 1, bf16 auto, adamw_torch_fused, no
    checkpointing; transformers' sdpa; no world size in the file."""
    p = write(tmp_path, "min.yml", "base_model: meta-llama/Llama-3.2-1B\ndatasets:\n  - path: x\n")
    i = read(p)
    s = i.setup
    assert (s.seq, s.batch, s.grad_accum, s.precision, s.adam_impl, (s.checkpointing == "full"), s.attention) == (
        512, 1, 1, "bf16-mixed", "fused", False, "sdpa")
    d = keyed(i.defaults)
    for key in ("sequence_len", "micro_batch_size", "gradient_accumulation_steps", "bf16", "optimizer",
                "gradient_checkpointing"):
        assert "axolotl 0.18.0" in d[key].tool and "067b021c" in d[key].source, key
    assert d["gpus"].tool == GPUS_UNKNOWN_TOOL


def test_axolotl_fsdp_both_key_styles(tmp_path):
    """The old fsdp list + fsdp_-prefixed fsdp_config keys and the new un-prefixed keys give one set-up."""
    old = write(tmp_path, "old.yaml", """
        base_model: meta-llama/Llama-3.1-8B
        micro_batch_size: 1
        sequence_len: 2048
        fsdp:
          - full_shard
          - auto_wrap
        fsdp_config:
          fsdp_offload_params: true
          fsdp_activation_checkpointing: true
          fsdp_sharding_strategy: FULL_SHARD
          fsdp_state_dict_type: FULL_STATE_DICT
        fsdp_version: 2
    """)
    new = write(tmp_path, "new.yaml", """
        base_model: meta-llama/Llama-3.1-8B
        micro_batch_size: 1
        sequence_len: 2048
        fsdp_version: 2
        fsdp_config:
          offload_params: true
          activation_checkpointing: true
          reshard_after_forward: true
          state_dict_type: FULL_STATE_DICT
    """)
    a, b = read(old), read(new)
    assert a.setup == b.setup
    s = a.setup
    assert (s.strategy, s.offload_params, s.offload_optimizer, (s.checkpointing == "full")) == ("fsdp2", True, True, True)
    assert "fsdp_config.fsdp_offload_params" in keyed(a.settings) and "fsdp_config.offload_params" in keyed(b.settings)
    assert "fsdp_config.fsdp_state_dict_type" in keyed(a.settings) and "fsdp_config.state_dict_type" in keyed(b.settings)
    assert a.setup.sharded_save is False                   # FULL_STATE_DICT: the whole model on rank 0 at a save


def test_axolotl_fsdp1_and_not_modelled(tmp_path):
    p = write(tmp_path, "v1.yaml", """
        base_model: meta-llama/Llama-3.1-8B
        fsdp_config:
          fsdp_sharding_strategy: SHARD_GRAD_OP
        gradient_checkpointing: offload
        context_parallel_size: 2
        optimizer: paged_adamw_32bit
        rl: orpo
    """)
    i = read(p)
    nm = keyed(i.not_modelled)
    assert i.setup.strategy == "fsdp1"
    assert "fsdp_config.fsdp_sharding_strategy" not in nm and i.setup.reshard_after_forward is False   # SHARD_GRAD_OP
    assert nm["gradient_checkpointing"].value == "offload" and (i.setup.checkpointing == "full")
    assert nm["optimizer"].value == "paged_adamw_32bit" and nm["rl"].value == "orpo"   # (kto is read)
    assert keyed(i.defaults)["fsdp_version"].value == 1


def test_axolotl_plugins_cce_and_qlora_dpo(tmp_path):
    p = write(tmp_path, "q.yaml", """
        base_model: meta-llama/Meta-Llama-3-8B-Instruct
        micro_batch_size: 2
        rl: dpo
        adapter: qlora
        load_in_4bit: true
        lora_r: 8
        lora_target_linear: true
        plugins:
          - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin
        liger_fused_linear_cross_entropy: true
        attn_implementation: sdpa
    """)
    i = read(p)
    s = i.setup
    assert (s.run, s.batch, s.lora_rank, s.lora_targets, s.fused_ce, s.attention) == ("dpo", 2, 8, "all-linear-names",
                                                                                       True, "sdpa")
    assert s.ref == "adapters-off"                         # LoRA: the base with the adapters disabled
    assert keyed(i.defaults)["cut_cross_entropy"].value is True
    assert "liger_fused_linear_cross_entropy" in keyed(i.ignored)            # no Liger plugin: no effect
    assert s.base_weights == "nf4-dq"           # axolotl's BitsAndBytesConfig: bnb_4bit_use_double_quant True


def test_axolotl_4bit_base_by_adapter_and_bnb_config_kwargs(tmp_path):
    """axolotl builds its BitsAndBytesConfig (nf4, double quantisation) only for adapter qlora; bnb_config_kwargs
    update it; with adapter lora, load_in_4bit quantises nothing (loaders/model.py)."""
    base = "base_model: meta-llama/Meta-Llama-3-8B\nlora_r: 8\nlora_target_linear: true\nload_in_4bit: true\n"
    off = read(write(tmp_path, "a.yaml", base + "adapter: qlora\nbnb_config_kwargs:\n  bnb_4bit_use_double_quant: "
                                               "false\n  llm_int8_threshold: 6.0\n"))
    assert off.setup.base_weights == "nf4" and "bnb_config_kwargs.llm_int8_threshold" in keyed(off.not_modelled)
    lora = read(write(tmp_path, "b.yaml", base + "adapter: lora\n"))
    assert lora.setup.base_weights is None and "no 4-bit base" in keyed(lora.settings)["load_in_4bit"].sets
    with pytest.raises(ConfigError) as err:
        read(write(tmp_path, "c.yaml", base + "adapter: qlora\nbnb_config_kwargs: [1]\n"))
    assert "bnb_config_kwargs must be a mapping" in str(err.value)


def test_axolotl_deepspeed_companion_by_name(tmp_path):
    """deepspeed: names a path in axolotl's repository; not beside the YAML, it is found among the files given."""
    y = write(tmp_path, "cfg/run.yaml", """
        base_model: meta-llama/Llama-3.2-3B
        micro_batch_size: 2
        sequence_len: 1024
        deepspeed: deepspeed_configs/zero2.json
    """)
    j = write(tmp_path, "elsewhere/zero2.json", '{"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}}')
    i = read([y, j])
    # no optimizer block: axolotl's default optimizer (adamw_torch_fused) is handed to DeepSpeed
    assert i.setup.strategy == "zero2" and i.setup.adam_impl == "fused" and i.setup.batch == 2
    assert i.files == [str(y), str(j)]
    with pytest.raises(ConfigError) as e:
        read(y)
    one_line_error(e, y, "deepspeed_configs/zero2.json", "--from zero2.json")


@pytest.mark.parametrize("body, words", [
    ("base_model: x/y\nmicro_batch_size: -2\n", ("micro_batch_size", "-2")),
    ("base_model: x/y\nsequence_len: 1024\ngradient_checkpointing: sometimes\n",
     ("gradient_checkpointing", "sometimes")),
    ("base_model: x/y\nsequence_len: 1024\nadapter: lora\nlora_r: 8\n", ("lora_target_modules",)),
    ("base_model: x/y\nsequence_len: 1024\nfsdp_version: 3\nfsdp_config:\n  offload_params: true\n", ("fsdp_version",)),
    ("base_model: x/y\nsequence_len: [1024\n", ("not valid YAML",)),
])
def test_axolotl_bad_files(tmp_path, body, words):
    p = write(tmp_path, "bad.yaml", body)
    with pytest.raises(ConfigError) as e:
        read(p)
    one_line_error(e, p, *words)


def test_axolotl_unknown_model_is_named(tmp_path):
    i = read(write(tmp_path, "u.yaml", "base_model: NousResearch/Some-Model\nsequence_len: 1024\n"))
    assert i.model is None and i.model_named == "NousResearch/Some-Model"


# --- the cases' configs --------------------------------------------------------------------------------------------

# What the files cannot say, per case, and the test therefore gives (each file's header says the same).
NOT_IN_FILE = {1: {}, 2: {}, 3: {"pin_memory": False}, 4: {"gpus": 8}, 5: {}}
FILES = {1: ["case1_openrlhf_sft.sh"], 2: ["case2_openrlhf_sft.sh"], 3: ["case3_openrlhf_sft.sh"],
         4: ["case4_axolotl.yaml", "deepspeed_configs/zero3_bf16.json"], 5: ["case5_torchtitan.toml"]}
FORMATS = {1: "openrlhf", 2: "openrlhf", 3: "openrlhf", 4: "axolotl", 5: "torchtitan"}


# axolotl's zero3_bf16.json has "sub_group_size": 0, which DeepSpeed 0.19.8 accepts (runtime/zero/config.py:
# sub_group_size Field(ge=0): every parameter its own optimizer sub-group, which sub_group_size 1 reproduces, as
# data/cases.json says); the DeepSpeed reader reads 0 as 1 and says so.


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_case_config_gives_the_case_estimate(n):
    """Each case written in its tool's own syntax reads back to the case's estimate: every phase of every category on
    the GPU and the host equal, capacities (gpu_gib, host_gib) taken from the case."""
    i = read([CONFIGS / f for f in FILES[n]])
    assert i.format == FORMATS[n]
    want = cases.setup(n)
    got = i.setup.replace(gpu_gib=want.gpu_gib, host_gib=want.host_gib, **NOT_IN_FILE[n])
    a, b = estimate.run(i.model, got), estimate.run(cases.case(n)["model"], want)
    assert a.gpu.breakdown == b.gpu.breakdown and a.host.breakdown == b.host.breakdown
    assert a.oom == b.oom
    for f in FILES[n]:
        head = (CONFIGS / f).read_text()[:2000]
        assert f"Case {n}" in head and "this project" in head
    differs = {f.name for f in dataclasses.fields(want) if getattr(got, f.name) != getattr(want, f.name)}
    # adam_impl: axolotl hands its default adamw_torch_fused to DeepSpeed (case 4's JSON has no optimizer block);
    # torch's fused AdamW keeps what DeepSpeed's FusedAdam does (asserted by the equal breakdowns above)
    # sync_each_batch: torchtitan's loop reduce-scatters every micro batch (case 5 accumulates none: no effect)
    assert differs <= {"gpus_per_node", "grad_checkpointing", "checkpointing", "overlap_comm", "adam_impl",
                       "sync_each_batch"}, differs
    assert got.checkpointing == want.checkpointing and got.ranks_per_node == want.ranks_per_node and got.overlap == want.overlap  # in effect


def test_case7_script_is_the_threads_run_and_micro_batch_2_the_case(tmp_path):
    """Case 7's script (OpenRLHF issue #908's own command, micro batch 1) reads to the case's fixed set-up; with micro
    batch 2 and train batch 16 (the smallest DeepSpeed accepts, as the header says) to the case's set-up."""
    f = CONFIGS / cases.case(7)["config"]
    head = f.read_text()[:2000]
    assert "Case 7" in head and "this project" in head and "issues/908" in head
    i = read(f, model="Qwen/Qwen2.5-7B-Instruct")
    assert i.format == "openrlhf"
    fixed = cases.setup(7, fixed=True)
    assert i.setup.replace(gpu_gib=fixed.gpu_gib) == fixed
    flag = "   --micro_train_batch_size 1 \\\n"
    assert f.read_text().count(flag) == 1
    text = f.read_text().replace(flag, flag.replace("1", "2"))
    p = write(tmp_path, "micro2.sh", "")
    p.write_text(text)
    with pytest.raises(ConfigError):                      # train batch 8: DeepSpeed's assertion, not an OOM
        read(p, model="Qwen/Qwen2.5-7B-Instruct")
    p.write_text(text.replace("   --train_batch_size 8 \\\n", "   --train_batch_size 16 \\\n"))
    want = cases.setup(7)
    assert read(p, model="Qwen/Qwen2.5-7B-Instruct").setup.replace(gpu_gib=want.gpu_gib) == want


def test_case_files_cannot_write_what_the_test_gives():
    """The settings the test supplies are those the files say they cannot write."""
    assert "pin_memory false" in (CONFIGS / "case3_openrlhf_sft.sh").read_text()
    assert "world size (8 GPUs" in (CONFIGS / "case4_axolotl.yaml").read_text()
    i = read(CONFIGS / "case2_openrlhf_sft.sh")
    assert i.setup.pin_memory is True and "in code" in keyed(i.defaults)[
        "zero_optimization.offload_optimizer.pin_memory"].source


# The fixes that can be written in the tool's own syntax, written as the files' headers say (cases 2 and 3's fixes,
# pin_memory false and DeepSpeed's offload ratio, have no OpenRLHF flag).
FIXES = {1: ("   --gradient_checkpointing\n", "   --gradient_checkpointing \\\n   --adam_offload\n"),
         4: ("# gradient_checkpointing: true\n# plugins:\n#   - axolotl.integrations.liger.LigerPlugin\n"
             "# liger_fused_linear_cross_entropy: true\n",
             "gradient_checkpointing: true\nplugins:\n  - axolotl.integrations.liger.LigerPlugin\n"
             "liger_fused_linear_cross_entropy: true\n"),
         5: ("local_batch_size = 1\n", "local_batch_size = 4\n"), }


@pytest.mark.parametrize("n", [1, 4, 5])
def test_case_fix_in_the_tools_syntax(tmp_path, n):
    """The case's fix, written into its config as its header says, reads back to `cases.setup(n, fixed=True)`."""
    for f in FILES[n]:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text((CONFIGS / f).read_text())
    main = tmp_path / FILES[n][0]
    old, new = FIXES[n]
    text = main.read_text()
    assert text.count(old) == 1
    text = text.replace(old, new)
    if n == 5:
        text = text.replace("enable_cpu_offload = false", "enable_cpu_offload = true")
    main.write_text(text)
    i = read([tmp_path / f for f in FILES[n]])
    want = cases.setup(n, fixed=True)
    got = i.setup.replace(gpu_gib=want.gpu_gib, host_gib=want.host_gib, **NOT_IN_FILE[n])
    a, b = estimate.run(i.model, got), estimate.run(cases.case(n)["model"], want)
    assert a.gpu.breakdown == b.gpu.breakdown and a.host.breakdown == b.host.breakdown and a.oom == b.oom


def test_axolotl_inline_deepspeed(tmp_path):
    p = write(tmp_path, "inline.yaml", """
        base_model: meta-llama/Llama-3.2-1B
        micro_batch_size: 2
        deepspeed:
          zero_optimization:
            stage: 1
    """)
    i = read(p)
    assert i.setup.strategy == "zero1" and i.files == [str(p)]
    assert keyed(i.settings)["zero_optimization.stage"].line == 5


def test_openrlhf_torchrun_launcher():
    i = openrlhf.read_command("torchrun --nnodes 2 --nproc_per_node 8 -m openrlhf.cli.train_sft --pretrain "
                              "Qwen/Qwen2.5-7B --zero_stage 3 --bf16 --micro_train_batch_size 1 --train_batch_size 16")
    assert (i.setup.gpus, i.setup.grad_accum, i.setup.strategy) == (16, 1, "zero3")
    assert keyed(i.settings)["launcher"].value == "launcher: 8 GPUs per node x 2 nodes"


def test_local_model_config_paths(tmp_path):
    """A model directory beside the config (holding config.json) is the model, for every reader that names one."""
    (tmp_path / "my-model").mkdir()
    (tmp_path / "my-model" / "config.json").write_text((ROOT / "data" / "models" / "qwen2.5-0.5b.json").read_text())
    a = read(write(tmp_path, "a.yaml", "base_model: ./my-model\nsequence_len: 256\n"))
    o = read(write(tmp_path, "o.sh", "deepspeed --module openrlhf.cli.train_sft --pretrain ./my-model --max_len 256\n"))
    want = str(tmp_path / "my-model" / "config.json")
    assert Path(a.model) == Path(want) and Path(o.model) == Path(want)
    assert a.model_named == o.model_named == "./my-model"
    assert estimate.run(a.model, a.setup).gpu.peak_bytes > 0
    with pytest.raises(ConfigError) as e:
        read(write(tmp_path, "b.yaml", "base_model: ./no-such-dir\nsequence_len: 256\n"))
    one_line_error(e, tmp_path / "b.yaml", "base_model", "no-such-dir")


def test_axolotl_world_size_from_dp_shard_size(tmp_path):
    p = write(tmp_path, "nd.yaml", """
        base_model: meta-llama/Llama-3.1-8B
        sequence_len: 2048
        dp_shard_size: 4
        fsdp_version: 2
        fsdp_config:
          reshard_after_forward: true
    """)
    i = read(p)
    assert (i.setup.gpus, i.setup.strategy) == (4, "fsdp2")
    assert "gpus" not in keyed(i.defaults) and keyed(i.settings)["dp_shard_size"].sets.startswith("gpus=4")


def test_openrlhf_qlora_under_zero2_is_modelled(tmp_path):
    """--load_in_4bit with LoRA under ZeRO-1/2: OpenRLHF's BitsAndBytesConfig (nf4, double quantisation); under ZeRO-3
    it is listed as not modelled and a bf16 base estimated."""
    cmd = ("deepspeed --module openrlhf.cli.train_sft --pretrain meta-llama/Llama-3.1-8B --zero_stage {z} "
           "--micro_train_batch_size 2 --max_len 1024 --bf16 --lora_rank 16 --load_in_4bit\n")
    s = read(write(tmp_path, "a.sh", cmd.format(z=2))).setup
    assert (s.strategy, s.base_weights, s.lora_rank) == ("zero2", "nf4-dq", 16)
    i = read(write(tmp_path, "b.sh", cmd.format(z=3)))
    assert i.setup.base_weights is None and "under zero3 is not modelled" in keyed(i.not_modelled)["--load_in_4bit"].why
