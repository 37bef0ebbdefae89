"""Readers of DeepSpeed JSON, LLaMA-Factory YAML, TRL YAML and accelerate config YAML: every key each reads, each
tool's defaults, "auto" resolution, settings listed as not modelled, and bad files as one-line errors naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import cases, estimate
from helpers.readers import ConfigError, read

CONFIGS = Path(__file__).resolve().parent.parent / "data" / "configs"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def ds_file(tmp_path: Path, data: dict, name: str = "ds.json") -> Path:
    return write(tmp_path, name, json.dumps(data, indent=2))


def by_key(items) -> dict:
    return {x.key: x for x in items}


def one_line_error(files, name: str) -> str:
    with pytest.raises(ConfigError) as e:
        read(files)
    msg = str(e.value)
    assert "\n" not in msg and name in msg, msg
    return msg


# --- DeepSpeed ----------------------------------------------------------------------------------------------------

FULL_DS = {
    "train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-5}},
    "zero_allow_untested_optimizer": True,
    "activation_checkpointing": {"partition_activations": True, "cpu_checkpointing": False},
    "zero_optimization": {
        "stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": False, "ratio": 0.5},
        "offload_param": {"device": "cpu", "pin_memory": False}, "reduce_bucket_size": 1e8,
        "sub_group_size": 5e8, "stage3_prefetch_bucket_size": 2e7, "overlap_comm": False,
        "stage3_max_live_parameters": 1e9},
}


def test_deepspeed_every_key(tmp_path):
    imp = read(ds_file(tmp_path, FULL_DS))
    s = imp.setup
    assert imp.format == "deepspeed" and imp.model is None
    assert (s.strategy, s.batch, s.grad_accum, s.gpus, s.precision) == ("zero3", 2, 4, 8, "bf16-mixed")
    assert (s.offload_optimizer, s.offload_params, s.offload_ratio, s.pin_memory) == (True, True, 0.5, False)
    assert (s.reduce_bucket_size, s.sub_group_size, s.prefetch_bucket_size, s.overlap_comm) == (10**8, 5 * 10**8,
                                                                                                 2 * 10**7, False)
    settings = by_key(imp.settings)
    assert settings["train_batch_size"].sets.startswith("gpus=8")
    assert settings["zero_optimization.stage"].line == json.dumps(FULL_DS, indent=2).splitlines().index(
        '    "stage": 3,') + 1
    nm = by_key(imp.not_modelled)
    assert "deepspeed.checkpointing" in nm["activation_checkpointing"].why
    assert "zero_optimization.stage3_max_live_parameters" in nm
    assert "zero_allow_untested_optimizer" in by_key(imp.ignored)
    assert by_key(imp.ignored)["optimizer.params"].value == {"lr": 1e-5}


def test_deepspeed_defaults_and_auto_alone(tmp_path):
    """A file with "auto" values and no trainer config: TrainingArguments' defaults, with the transformers version."""
    imp = read(CONFIGS / "ds_z2_auto.json")
    s = imp.setup
    assert (s.strategy, s.batch, s.grad_accum, s.precision, s.gpus) == ("zero2", 8, 1, "fp32", 1)
    defaults = by_key(imp.defaults)
    assert defaults["per_device_train_batch_size"].value == 8
    assert defaults["per_device_train_batch_size"].tool.startswith("transformers ")
    assert defaults["gpus"].tool == "not in the files" and "--gpus" in defaults["gpus"].source
    auto = by_key(imp.settings)["train_micro_batch_size_per_gpu"]
    assert auto.value == "auto" and "auto -> per_device_train_batch_size" in auto.sets
    # hidden-size rules need a model: listed, not silently replaced
    assert by_key(imp.not_modelled)["zero_optimization.reduce_bucket_size"].value == "auto"
    # DeepSpeed's own defaults for a file that says nothing of ZeRO
    bare = read(ds_file(tmp_path, {"train_micro_batch_size_per_gpu": 1}))
    assert bare.setup.strategy == "ddp" and by_key(bare.defaults)["zero_optimization.stage"].tool.startswith("DeepSpeed")
    z3 = read(ds_file(tmp_path, {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}, "z3.json"))
    assert z3.setup.pin_memory is True and by_key(z3.defaults)["zero_optimization.overlap_comm"].value is True


def test_deepspeed_optimizer_block_under_zero3_is_one_parameter_group(tmp_path):
    """A ZeRO-3 JSON that names an optimizer is run by the HF Trainer with DummyOptim(model_parameters): one parameter
    group, so its sub-groups (and what an offload ratio moves) follow the whole model; without the block the Trainer's
    own optimizer hands over two groups (decay, then biases and norm weights): TrainSetup's default."""
    zero3 = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}}
    named = read(write(tmp_path, "named.json", json.dumps(zero3 | {"optimizer": {"type": "AdamW"}})))
    assert named.setup.optimizer_groups == "one"
    assert "DummyOptim" in next(x.sets for x in named.settings if x.key == "optimizer.type")
    assert read(write(tmp_path, "none.json", json.dumps(zero3))).setup.optimizer_groups == "decay"
    zero2 = {"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW"}}
    assert read(write(tmp_path, "z2.json", json.dumps(zero2))).setup.optimizer_groups == "decay"   # (ZeRO-3 only)
    torch_adam = {"zero_optimization": {"stage": 3},
                  "optimizer": {"type": "AdamW", "params": {"torch_adam": True, "fused": True}}}
    both = read(write(tmp_path, "ta.json", json.dumps(torch_adam))).setup
    assert (both.optimizer_groups, both.adam_impl) == ("one", "fused")     # torch_adam read under ZeRO-3 too


def test_deepspeed_not_modelled(tmp_path):
    imp = read(ds_file(tmp_path, {"fp16": {"enabled": True}, "optimizer": {"type": "Lamb"},
                                  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}}))
    nm = by_key(imp.not_modelled)
    assert nm["fp16.enabled"].value is True and nm["optimizer.type"].value == "Lamb"
    assert nm["zero_optimization.offload_optimizer.device"].value == "nvme"
    assert imp.setup.offload_optimizer is False


def test_deepspeed_bad_files(tmp_path):
    bad = write(tmp_path, "broken.json", '{"zero_optimization": {"stage": 3,}')
    assert "not valid JSON" in one_line_error([bad], "broken.json")
    assert "stage" in one_line_error([ds_file(tmp_path, {"zero_optimization": {"stage": 4}}, "s4.json")], "s4.json")
    msg = one_line_error([ds_file(tmp_path, {"train_micro_batch_size_per_gpu": -2}, "neg.json")], "neg.json")
    assert "train_micro_batch_size_per_gpu" in msg


# --- LLaMA-Factory --------------------------------------------------------------------------------------------------

def test_case6_llamafactory_files_are_case6():
    imp = read([CONFIGS / "case6_llamafactory.yaml", CONFIGS / "ds_z3_offload_config.json"])
    want = cases.setup(6)
    assert imp.model == cases.case(6)["model"]
    assert imp.setup == want.replace(gpu_gib=None, host_gib=None)
    got = estimate.run(imp.model, imp.setup.replace(gpu_gib=want.gpu_gib, host_gib=want.host_gib))
    ref = estimate.run(cases.case(6)["model"], want)
    assert got.gpu.peak_bytes == ref.gpu.peak_bytes and got.host.peak_bytes == ref.host.peak_bytes
    s = by_key(imp.settings)
    assert "auto -> hidden_size^2, hidden_size 5120" in s["zero_optimization.reduce_bucket_size"].sets
    assert "auto -> per_device_train_batch_size = 1" in s["train_micro_batch_size_per_gpu"].sets
    assert "51,200 elements" in by_key(imp.not_modelled)["zero_optimization.stage3_param_persistence_threshold"].why
    d = by_key(imp.defaults)
    assert d["disable_gradient_checkpointing"].tool.startswith("LLaMA-Factory") and (imp.setup.checkpointing == "full")
    # the companion found beside the YAML also when only the YAML is given
    assert read(CONFIGS / "case6_llamafactory.yaml").setup == imp.setup


LF_ALL = """\
model_name_or_path: meta-llama/Meta-Llama-3-8B
stage: sft
finetuning_type: lora
lora_rank: 32
lora_target: q_proj,v_proj
per_device_train_batch_size: 4
gradient_accumulation_steps: 2
cutoff_len: 1024
bf16: true
disable_gradient_checkpointing: true
enable_liger_kernel: true
flash_attn: fa2
packing: true
optim: adamw_8bit
use_dora: true
template: llama3
learning_rate: 1.0e-4
"""


def test_llamafactory_every_key(tmp_path):
    imp = read(write(tmp_path, "lf.yaml", LF_ALL))
    s = imp.setup
    assert imp.format == "llamafactory" and imp.model == "llama-3-8b"
    assert (s.lora_rank, s.lora_targets, s.batch, s.grad_accum, s.seq) == (32, "q_proj,v_proj", 4, 2, 1024)
    assert (s.precision, (s.checkpointing == "full"), s.fused_ce, s.attention, s.optimizer) == (
        "bf16-mixed", False, True, "flash", "adamw-8bit")
    assert by_key(imp.settings)["lora_rank"].line == 4
    assert "packing" in by_key(imp.settings)
    assert "use_dora" in by_key(imp.not_modelled)
    assert {"template", "learning_rate"} <= set(by_key(imp.ignored))


def test_llamafactory_defaults(tmp_path):
    imp = read(write(tmp_path, "lf.yaml", "model_name_or_path: Qwen/Qwen2.5-7B-Instruct\ntemplate: qwen\n"))
    s, d = imp.setup, by_key(imp.defaults)
    assert imp.model == "qwen2.5-7b"
    assert (s.lora_rank, s.lora_targets, s.seq, s.batch, (s.checkpointing == "full"), s.precision, s.gpus) == (
        8, "all-linear-names", 2048, 8, True, "fp32", 1)
    assert d["finetuning_type"].value == "lora" and d["finetuning_type"].tool.startswith("LLaMA-Factory 0.9")
    assert d["cutoff_len"].source.endswith("data_args.py")
    assert d["per_device_train_batch_size"].tool.startswith("transformers")


def test_llamafactory_not_modelled(tmp_path):
    imp = read(write(tmp_path, "lf.yaml", "model_name_or_path: meta-llama/Meta-Llama-3-8B\nstage: dpo\n"
                                          "finetuning_type: lora\nquantization_bit: 8\nfp16: true\n"))
    nm = by_key(imp.not_modelled)
    assert "stage" not in nm and imp.setup.run == "dpo" and imp.setup.ref == "adapters-off"
    assert nm["quantization_bit"].value == 8 and "fp16" not in nm
    assert imp.setup.precision == "fp16-mixed" and by_key(imp.settings)["fp16"].value is True   # autocast + GradScaler
    q4 = read(write(tmp_path, "q4.yaml", "model_name_or_path: meta-llama/Meta-Llama-3-8B\nquantization_bit: 4\n"))
    assert q4.setup.base_weights == "nf4-dq"              # LLaMA-Factory's double_quantization defaults to True
    assert any(d.key == "double_quantization" and d.value is True for d in q4.defaults)
    q4 = read(write(tmp_path, "q4.yaml", "model_name_or_path: meta-llama/Meta-Llama-3-8B\nquantization_bit: 4\n"
                                         "double_quantization: false\n"))
    assert q4.setup.base_weights == "nf4"
    with pytest.raises(ConfigError, match="quantization_method must be one of bnb, gptq"):   # LLaMA-Factory's enum
        read(write(tmp_path, "q4.yaml", "model_name_or_path: meta-llama/Meta-Llama-3-8B\nquantization_bit: 4\n"
                                        "quantization_method: bitsandbytes\n"))
    gptq = read(write(tmp_path, "g.yaml", "model_name_or_path: meta-llama/Meta-Llama-3-8B\nquantization_bit: 4\n"
                                          "quantization_method: gptq\n"))
    assert "4-bit gptq base weights" in by_key(gptq.not_modelled)["quantization_bit"].why


def test_llamafactory_models(tmp_path):
    unknown = read(write(tmp_path, "u.yaml", "model_name_or_path: some-org/some-model\nfinetuning_type: full\n"))
    assert unknown.model is None and unknown.model_named == "some-org/some-model"
    local = tmp_path / "m"
    local.mkdir()
    (local / "config.json").write_text((Path(__file__).parent / "data" / "tiny-llama.json").read_text())
    imp = read(write(tmp_path, "l.yaml", "model_name_or_path: ./m\nfinetuning_type: full\n"))
    assert imp.model == str(local / "config.json") and imp.model_named == "./m"
    assert "no model config" in one_line_error([write(tmp_path, "p.yaml", "model_name_or_path: ./nothing\n"
                                                                          "finetuning_type: full\n")], "p.yaml")


def test_llamafactory_bad_files(tmp_path):
    yaml_text = "model_name_or_path: meta-llama/Meta-Llama-3-8B\nfinetuning_type: full\n"
    msg = one_line_error([write(tmp_path, "a.yaml", yaml_text + "deepspeed: missing_ds.json\n")], "a.yaml")
    assert "missing_ds.json" in msg
    assert "not valid YAML" in one_line_error([write(tmp_path, "b.yaml", yaml_text + "cutoff_len: [1\n")], "b.yaml")
    msg = one_line_error([write(tmp_path, "c.yaml", yaml_text + "per_device_train_batch_size: -1\n")], "c.yaml")
    assert "per_device_train_batch_size" in msg
    assert "model_name_or_path" in one_line_error([write(tmp_path, "d.yaml", "finetuning_type: full\ntemplate: x\n"
                                                                             "cutoff_len: 1\n")], "d.yaml")
    # a DeepSpeed number that differs from the trainer's: the HF Trainer refuses it, so do we
    ds_file(tmp_path, {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}, "mm.json")
    msg = one_line_error([write(tmp_path, "e.yaml", yaml_text + "per_device_train_batch_size: 4\n"
                                                                "deepspeed: mm.json\n")], "mm.json")
    assert "mismatch" in msg
    # LoRA with a strategy that does not model it: the validation's message, naming the file
    ds_file(tmp_path, {"zero_optimization": {"stage": 3}}, "z3.json")
    one_line_error([write(tmp_path, "f.yaml", "model_name_or_path: meta-llama/Meta-Llama-3-8B\n"
                                              "finetuning_type: lora\ndeepspeed: z3.json\n")], "f.yaml") \
        if not _lora_zero3() else None


def _lora_zero3() -> bool:
    from helpers import strategies

    return strategies.get("zero3").lora


def test_companion_found_among_given_files(tmp_path):
    sub = tmp_path / "elsewhere"
    sub.mkdir()
    ds = ds_file(sub, {"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}}, "z2.json")
    yml = write(tmp_path, "g.yaml", "model_name_or_path: meta-llama/Meta-Llama-3-8B\nfinetuning_type: full\n"
                                    "bf16: true\ndeepspeed: examples/deepspeed/z2.json\n")
    imp = read([yml, ds])
    assert imp.setup.strategy == "zero2" and imp.setup.precision == "bf16-mixed"
    assert str(ds) in imp.files


# --- TRL and accelerate ----------------------------------------------------------------------------------------------

def test_trl_with_accelerate_either_order():
    trl, acc = CONFIGS / "trl_sft_llama3_8b.yaml", CONFIGS / "accelerate_fsdp2.yaml"
    a, b = read([trl, acc]), read([acc, trl])
    assert a.setup == b.setup and a.format == "trl" and a.model == "llama-3-8b"
    s = a.setup
    assert (s.strategy, s.gpus, s.gpus_per_node, s.batch, s.grad_accum, s.seq) == ("fsdp2", 8, 8, 2, 8, 4096)
    assert (s.precision, (s.checkpointing == "full"), s.fused_ce, s.attention) == ("bf16", True, True, "sdpa")
    settings = by_key(a.settings)
    assert "overridden" in settings["mixed_precision"].sets
    assert settings["num_processes"].file.endswith("accelerate_fsdp2.yaml")


TRL_ALL = """\
model_name_or_path: Qwen/Qwen2.5-7B-Instruct
per_device_train_batch_size: 2
gradient_accumulation_steps: 16
gradient_checkpointing: false
bf16: true
max_seq_length: 512
packing: false
use_peft: true
lora_r: 64
lora_target_modules: [q_proj, k_proj]
load_in_8bit: true
optim: paged_adamw_8bit
use_liger_kernel: true
attn_implementation: flash_attention_2
torch_dtype: float32
beta: 0.1
output_dir: out
"""


def test_trl_every_key(tmp_path):
    imp = read(write(tmp_path, "trl.yaml", TRL_ALL))
    s = imp.setup
    assert imp.format == "trl" and imp.model == "qwen2.5-7b"
    assert (s.batch, s.grad_accum, (s.checkpointing == "full"), s.seq, s.lora_rank, s.lora_targets) == (
        2, 16, False, 512, 64, "q_proj,k_proj")
    assert (s.precision, s.optimizer, s.fused_ce, s.attention) == ("bf16-mixed", "adamw-8bit", True, "flash")
    nm = by_key(imp.not_modelled)
    assert {"load_in_8bit", "optim"} <= set(nm) and s.run == "dpo"          # beta: a DPOConfig key
    assert "output_dir" in by_key(imp.ignored)


def test_trl_defaults(tmp_path):
    imp = read(write(tmp_path, "trl.yaml", "model_name_or_path: meta-llama/Meta-Llama-3-8B\nuse_peft: true\n"))
    s, d = imp.setup, by_key(imp.defaults)
    assert (s.seq, (s.checkpointing == "full"), s.precision, s.batch, s.lora_rank, s.lora_targets) == (
        1024, True, "bf16-mixed", 8, 16, "q_proj,v_proj")
    assert d["max_length"].tool.startswith("TRL") and "sft_config.py" in d["max_length"].source
    assert d["gradient_checkpointing"].value is True and d["lora_target_modules"].tool == "peft"
    assert d["dtype"].value == "float32"
    q = read(write(tmp_path, "q.yaml", "model_name_or_path: meta-llama/Meta-Llama-3-8B\nuse_peft: true\n"
                                       "load_in_4bit: true\n"))
    assert q.setup.base_weights == "nf4" and by_key(q.defaults)["use_bnb_nested_quant"].value is False
    q = read(write(tmp_path, "q.yaml", "model_name_or_path: meta-llama/Meta-Llama-3-8B\nuse_peft: true\n"
                                       "load_in_4bit: true\nuse_bnb_nested_quant: true\n"))
    assert q.setup.base_weights == "nf4-dq"


def test_trl_qlora_or_fsdp_on_its_float32_default_is_listed_with_its_bytes(tmp_path):
    """TRL loads the model in float32 unless `dtype` says otherwise (ModelConfig.dtype, SFTTrainer's docstring). LoRA
    on that base on one GPU is modelled (base_weights=fp32, tests/test_lora_fp32_base.py); a QLoRA base's fp32 parts,
    and an fp32 base under FSDP's sharding, are listed with the bytes the estimate is under by at least; DeepSpeed
    casts the module to bf16 itself, and nothing is listed."""
    base = "model_name_or_path: meta-llama/Llama-3.2-3B\nuse_peft: true\nbf16: true\n"
    q = read(write(tmp_path, "q.yaml", base + "dtype: float32\nload_in_4bit: true\nbnb_4bit_quant_type: nf4\n"))
    assert "unquantised embedding, norms and head" in by_key(q.not_modelled)["dtype"].why
    assert by_key(q.settings)["bnb_4bit_quant_type"].value == "nf4" and by_key(q.settings)["bf16"].value is True
    f = read(write(tmp_path, "f.yaml", base + "fsdp: full_shard auto_wrap\nfsdp_config:\n  version: 2\n"))
    nm = by_key(f.not_modelled)
    assert f.setup.strategy == "fsdp2" and f.setup.base_weights is None
    assert "higher by at least 2 bytes per such parameter (5.98 GiB for llama-3.2-3b in all, divided over the GPUs " \
           "that shard it)" in nm["dtype"].why        # (not per GPU: --gpus may change the world after reading)
    assert nm["dtype"].line is None and "default" in nm["dtype"].file
    ds_file(tmp_path, {"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}, "z2.json")
    z = read(write(tmp_path, "z.yaml", base + "deepspeed: z2.json\n"))
    assert z.setup.strategy == "zero2" and z.setup.base_weights is None and "dtype" not in by_key(z.not_modelled)
    # ... but it loads in float32 first, on every rank's host (create_model_from_path, device_map None under DeepSpeed)
    assert z.setup.load_dtype == "fp32" and by_key(z.defaults)["dtype"].fields == {"load_dtype": "fp32"}
    assert by_key(z.defaults)["dtype"].sets == "weights loaded in fp32, cast by DeepSpeed"
    b = read(write(tmp_path, "b.yaml", base + "deepspeed: z2.json\ndtype: bfloat16\n"))
    assert b.setup.load_dtype == "bf16" and by_key(b.settings)["dtype"].line == 5
    assert read(write(tmp_path, "a.yaml", base + "deepspeed: z2.json\ndtype: auto\n")).setup.load_dtype == "bf16"
    qz = read(write(tmp_path, "qz.yaml", base + "deepspeed: z2.json\nload_in_4bit: true\n"))
    assert qz.setup.base_weights == "nf4" and qz.setup.load_dtype is None     # quantised as it loads
    assert f.setup.load_dtype is None                                          # a torch engine: its own dtype


def test_trl_deepspeed_companion_auto(tmp_path):
    ds_file(tmp_path, {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                       "bf16": {"enabled": "auto"},
                       "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
                                             "stage3_prefetch_bucket_size": "auto"}}, "z3.json")
    imp = read(write(tmp_path, "t.yaml", "model_name_or_path: meta-llama/Meta-Llama-3-8B\n"
                                         "per_device_train_batch_size: 3\ndeepspeed: z3.json\n"))
    s = imp.setup
    assert (s.strategy, s.batch, s.grad_accum, s.precision) == ("zero3", 3, 1, "bf16-mixed")
    assert (s.reduce_bucket_size, s.prefetch_bucket_size) == (4096 ** 2, int(0.9 * 4096 ** 2))
    assert "auto -> bf16 = True" in by_key(imp.settings)["bf16.enabled"].sets


def test_accelerate_deepspeed_and_fsdp(tmp_path):
    ds_file(tmp_path, {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                                             "offload_optimizer": {"device": "cpu"}}}, "z3.json")
    acc = write(tmp_path, "acc.yaml", "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
                                      "deepspeed_config:\n  deepspeed_config_file: z3.json\n  zero3_init_flag: true\n"
                                      "mixed_precision: bf16\nnum_machines: 2\nnum_processes: 16\n")
    imp = read(acc)
    s = imp.setup
    assert imp.format == "accelerate" and imp.model is None
    assert (s.strategy, s.gpus, s.gpus_per_node, s.offload_params, s.precision) == ("zero3", 16, 8, True, "bf16-mixed")
    assert str(tmp_path / "z3.json") in imp.files
    keys = write(tmp_path, "k.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n"
                                     "  offload_optimizer_device: cpu\n  gradient_accumulation_steps: 4\n"
                                     "num_processes: 4\nmixed_precision: fp16\n")
    s = read(keys).setup
    assert (s.strategy, s.offload_optimizer, s.grad_accum, s.gpus) == ("zero2", True, 4, 4)
    assert "mixed_precision" in by_key(read(keys).not_modelled)
    v1 = write(tmp_path, "f1.yaml", "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n"
                                    "  fsdp_offload_params: true\n  fsdp_activation_checkpointing: true\n"
                                    "num_processes: 2\n")
    imp = read(v1)
    assert imp.setup.offload_params and (imp.setup.checkpointing == "full")
    assert imp.setup.strategy == "fsdp1"
    multi = read(write(tmp_path, "m.yaml", "distributed_type: MULTI_GPU\nnum_processes: 2\nmixed_precision: 'no'\n"))
    assert (multi.setup.strategy, multi.setup.gpus, multi.setup.precision) == ("ddp", 2, "fp32")
    assert "z9.json" in one_line_error([write(tmp_path, "x.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n"
                                                                  "  deepspeed_config_file: z9.json\n")], "x.yaml")


def test_unrelated_file_refused(tmp_path):
    trl = write(tmp_path, "t.yaml", "model_name_or_path: meta-llama/Meta-Llama-3-8B\n")
    stray = ds_file(tmp_path, {"zero_optimization": {"stage": 1}}, "stray.json")
    assert "does not refer" in one_line_error([trl, stray], "stray.json")


def test_llamafactory_pure_bf16(tmp_path):
    base_yaml = "model_name_or_path: meta-llama/Meta-Llama-3-8B\nfinetuning_type: full\npure_bf16: true\n"
    assert read(write(tmp_path, "p.yaml", base_yaml)).setup.precision == "bf16"
    ds_file(tmp_path, {"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}}, "z2.json")
    imp = read(write(tmp_path, "q.yaml", base_yaml + "deepspeed: z2.json\n"))
    assert imp.setup.precision == "bf16-mixed" and "pure_bf16" in by_key(imp.not_modelled)
    ds_file(tmp_path, {"zero_optimization": {"stage": 3}}, "z3.json")
    assert "ZeRO-3" in one_line_error([write(tmp_path, "r.yaml", base_yaml + "deepspeed: z3.json\n")], "r.yaml")


def test_claims_keep_formats_apart(tmp_path):
    from helpers.readers import accelerate, deepspeed, llamafactory, trl

    axolotl_like = {"base_model": "x", "micro_batch_size": 1, "gradient_accumulation_steps": 2, "output_dir": "o"}
    assert not trl.claims(Path("a.yaml"), axolotl_like) and not llamafactory.claims(Path("a.yaml"), axolotl_like)
    acc = {"distributed_type": "FSDP", "num_processes": 8}
    assert accelerate.claims(Path("a.yaml"), acc) and not trl.claims(Path("a.yaml"), acc)
    assert deepspeed.claims(Path("d.json"), {"zero_optimization": {}}) and not deepspeed.claims(Path("d.json"), {})


def test_trl_native_fsdp_and_bfloat16_alias(tmp_path):
    imp = read(write(tmp_path, "t.yaml", "model_name_or_path: meta-llama/Meta-Llama-3-8B\nfsdp: full_shard offload\n"
                                         "fsdp_config:\n  version: 2\n  activation_checkpointing: true\n"
                                         "gradient_checkpointing: false\n"))
    s = imp.setup
    assert (s.strategy, s.offload_optimizer, s.offload_params, (s.checkpointing == "full")) == ("fsdp2", True, True, True)
    alias = read(ds_file(tmp_path, {"bfloat16": {"enabled": True}, "zero_optimization": {"stage": 1}}))
    assert alias.setup.precision == "bf16-mixed" and "bfloat16.enabled" in by_key(alias.settings)


def test_qlora_under_zero_is_listed_not_refused(tmp_path):
    """LLaMA-Factory's quantization_bit 4 with a ZeRO-3 DeepSpeed file: a 4-bit base is modelled with single, ddp,
    zero1 and zero2 only, so the run is read (a bf16 base estimated) and the setting listed as not modelled, with its
    line; under ZeRO-2 it is modelled."""
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}}')
    (tmp_path / "q.yaml").write_text("model_name_or_path: meta-llama/Meta-Llama-3-8B\nfinetuning_type: lora\n"
                                     "lora_rank: 8\nquantization_bit: 4\nbf16: true\ndeepspeed: ds.json\n")
    assert read([tmp_path / "q.yaml"]).setup.base_weights == "nf4-dq"
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"}}')
    (tmp_path / "q.yaml").write_text("model_name_or_path: meta-llama/Meta-Llama-3-8B\nfinetuning_type: lora\n"
                                     "lora_rank: 8\nquantization_bit: 4\nbf16: true\ndeepspeed: ds.json\n")
    i = read([tmp_path / "q.yaml"])
    assert (i.setup.strategy, i.setup.base_weights, i.setup.lora_rank) == ("zero3", None, 8)
    nm = {n.key: n for n in i.not_modelled}
    assert nm["quantization_bit"].line == 4 and "under zero3 is not modelled" in nm["quantization_bit"].why
    assert not any(s.key == "quantization_bit" for s in i.settings)
    assert not any(d.key == "double_quantization" for d in i.defaults)     # gone with the 4-bit base it refines
    (tmp_path / "q.yaml").write_text((tmp_path / "q.yaml").read_text().replace("deepspeed: ds.json\n", ""))
    assert read([tmp_path / "q.yaml"]).setup.base_weights == "nf4-dq"


@pytest.mark.parametrize("fmt,text,bad,near", [
    ("trl", "use_peft: true\nper_device_train_batch_sise: 16\n", "per_device_train_batch_sise",
     "per_device_train_batch_size"),
    ("trl", "max_lenght: 4096\n", "max_lenght", "max_length"),
    ("llamafactory", "stage: sft\nfinetuning_type: lora\ncutof_len: 4096\n", "cutof_len", "cutoff_len"),
    ("trl", "per_device_train_batch_size: 2\nper_device_train_batch_sise: 4\n", "per_device_train_batch_sise",
     "per_device_train_batch_size"),                     # beside the right key: TRL refuses it all the same
])
def test_a_misspelt_memory_key_is_refused_not_ignored(tmp_path, fmt, text, bad, near):
    """TRL's and LLaMA-Factory's parsers refuse keys their arguments do not have; read as ignored, a misspelt batch
    size or length would train at its default in the estimate. Valid keys that look alike (a TrainingArguments field
    such as per_device_eval_batch_size) are not touched."""
    with pytest.raises(ConfigError) as err:
        read(write(tmp_path, f"{fmt}.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\n" + text))
    assert f"unknown key {bad!r}: did you mean {near!r}?" in str(err.value) and "\n" not in str(err.value)
    ok = read(write(tmp_path, "ok.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\nuse_peft: true\n"
                                         "per_device_eval_batch_size: 4\ngradient_checkpointing_kwargs: {}\n"))
    assert "per_device_eval_batch_size" in by_key(ok.ignored)


def test_trl_sft_loss_types_are_read_as_sft_and_dpo_ones_as_dpo(tmp_path):
    """SFTConfig.loss_type (nll, dft, chunked_nll) is an SFT file's key: a user's `loss_type: nll` was read as DPO and
    given a reference model. It sets trl_loss_type (dft's memory is nll's), and left out TRL's release default
    ('unset'); with use_liger_kernel the loss is Liger's. DPOConfig's (sigmoid, ...) still makes the run DPO; TRL
    0.x's max_prompt_length, dropped by 1.x, is listed as ignored."""
    base = "model_name_or_path: meta-llama/Llama-3.2-3B\nbf16: true\n"
    for value, loss in (("nll", "nll"), ("dft", "nll"), ("chunked_nll", "chunked_nll")):
        imp = read(write(tmp_path, f"{value}.yaml", base + f"loss_type: {value}\n"))
        assert imp.setup.run == "sft" and by_key(imp.settings)["loss_type"].value == value
        assert imp.setup.trl_loss_type == loss and not imp.not_modelled
        assert "(trainer)" in by_key(imp.defaults)
    default = read(write(tmp_path, "d.yaml", base))
    assert default.setup.trl_loss_type == "unset" and "loss_type" in by_key(default.defaults)
    liger = read(write(tmp_path, "l.yaml", base + "use_liger_kernel: true\n"))
    assert liger.setup.trl_loss_type is None and liger.setup.fused_ce       # nll, through Liger's kernel
    both = read(write(tmp_path, "b.yaml", base + "use_liger_kernel: true\nloss_type: chunked_nll\n"))
    assert both.setup.fused_ce and "1.15 on takes chunked_nll as nll" in by_key(both.not_modelled)["loss_type"].why
    dpo = read(write(tmp_path, "p.yaml", base + "loss_type: sigmoid\nmax_prompt_length: 512\n"))
    assert dpo.setup.run == "dpo" and "max_prompt_length" in by_key(dpo.ignored)
    assert "loss_type" not in by_key(dpo.defaults) and dpo.setup.trl_loss_type is None


def test_a_sharding_strategy_on_an_assumed_single_gpu_is_said_beside_the_verdict(tmp_path, capsys):
    """A TRL YAML naming a DeepSpeed JSON says no world size: 1 GPU is assumed, and ZeRO-2 then shards nothing, so
    the verdict is one GPU's whole share; a line beside it says so, and goes once --gpus is given."""
    from helpers.__main__ import main

    ds_file(tmp_path, {"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}, "z2.json")
    cfg = write(tmp_path, "t.yaml", "model_name_or_path: meta-llama/Llama-3.2-3B\nbf16: true\ndeepspeed: z2.json\n")
    line = ("the files do not say how many GPUs the run uses: 1 is assumed, and zero2 on one GPU shards nothing; "
            "pass --gpus N (and --gpus-per-node) for the run's world size")
    assert main(["estimate", "--from", str(cfg), "--gpu-gib", "80"]) == 0
    assert line in capsys.readouterr().out.splitlines()
    assert main(["estimate", "--from", str(cfg), "--gpu-gib", "80", "--gpus", "8"]) == 0
    assert "the files do not say how many GPUs" not in capsys.readouterr().out
    assert main(["estimate", "--from", str(cfg), "--gpu-gib", "80", "--gpus", "1"]) == 0    # one GPU, said by a flag
    out = capsys.readouterr().out
    assert "the files do not say how many GPUs" not in out and "flag, overrides 1 from default" in out
    single = write(tmp_path, "s.yaml", "model_name_or_path: meta-llama/Llama-3.2-3B\nbf16: true\n")
    assert main(["estimate", "--from", str(single), "--gpu-gib", "80"]) == 0
    assert "the files do not say how many GPUs" not in capsys.readouterr().out      # one GPU shards nothing anyway


def test_a_trl_loss_type_neither_sft_nor_dpo_is_refused_not_read_as_dpo(tmp_path):
    """`loss_type: chunked` (a typo of chunked_nll) made an SFT file a DPO run with a reference model."""
    base = "model_name_or_path: meta-llama/Llama-3.2-3B\nbf16: true\n"
    with pytest.raises(ConfigError) as err:
        read(write(tmp_path, "t.yaml", base + "loss_type: chunked\n"))
    assert "none of SFTConfig's" in str(err.value) and "did you mean chunked_nll?" in str(err.value)
    assert read(write(tmp_path, "m.yaml", base + "loss_type: [sigmoid, sft]\n")).setup.run == "dpo"
    grpo = read(write(tmp_path, "g.yaml", base + "num_generations: 4\nloss_type: dapo\n"))
    assert grpo.setup is not None


TRL_FP32_LORA = """model_name_or_path: Qwen/Qwen2.5-7B
per_device_train_batch_size: 2
max_length: 1024
bf16: true
use_peft: true
lora_r: 16
"""


def test_a_strategy_flag_restates_trls_float32_base_in_its_own_terms(tmp_path, capsys):
    """A TRL LoRA file leaves dtype to TRL's float32: on one GPU that is base_weights 'fp32' (autocast over an fp32
    base). Under `--strategy zero2` DeepSpeed casts the module it is given, so the same fact is load_dtype 'fp32' (once
    refused: "base_weights 'fp32' ... on 'zero2'"); the table says which values the flags restated."""
    from helpers.__main__ import main

    f = tmp_path / "sft.yaml"
    f.write_text(TRL_FP32_LORA)
    assert read(f, model="qwen2.5-7b").setup.base_weights == "fp32"
    code = main(["estimate", "--from", str(f), "--model", "qwen2.5-7b", "--offline", "--strategy", "zero2",
                 "--gpus", "8", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0 and (d["setup"]["base_weights"], d["setup"]["load_dtype"]) == (None, "fp32")
    assert main(["estimate", "--from", str(f), "--model", "qwen2.5-7b", "--offline", "--strategy", "zero2",
                 "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.lstrip().startswith("(follows the flags)")]
    assert len(rows) == 2 and "base_weights=None" in rows[0] and "was fp32" in rows[0] and "load_dtype=fp32" in rows[1]
    # a typed value is never restated: --base-weights fp32 under zero2 is refused as before
    assert main(["estimate", "--from", str(f), "--model", "qwen2.5-7b", "--offline", "--strategy", "zero2",
                 "--gpus", "8", "--base-weights", "fp32"]) == 2
    assert "base_weights 'fp32'" in capsys.readouterr().err
    # and back: a DeepSpeed run's float32 load on one GPU is the fp32 base under autocast
    ds = tmp_path / "ds.json"
    ds.write_text('{"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}}')
    g = tmp_path / "sft_ds.yaml"
    g.write_text(TRL_FP32_LORA + f"deepspeed: {ds}\n")
    assert read(g, model="qwen2.5-7b").setup.load_dtype == "fp32"
    assert main(["estimate", "--from", str(g), "--model", "qwen2.5-7b", "--offline", "--strategy", "single",
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["setup"]["base_weights"], d["setup"]["load_dtype"]) == ("fp32", None)
