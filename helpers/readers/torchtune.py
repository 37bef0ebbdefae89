"""Reader of a torchtune recipe config (`tune run lora_finetune_single_device --config 1B_lora_single_device.yaml`):
the model builder (`model._component_` with its LoRA arguments), batch_size, gradient_accumulation_steps, dtype,
activation checkpointing and offloading, the optimizer, the loss, FSDP's keys and the tokenizer's max_seq_len.

Source read: github:pytorch/torchtune at commit bd2a0fc (2026-04-23):
- `recipes/{full,lora}_finetune_{single_device,distributed}.py`: `dtype` through `training.get_dtype` (bf16 or fp32;
  fp16 refused: 'full fp16 training is not supported'); with bf16 every weight, gradient and optimizer state is
  bf16 (no fp32 master); enable_activation_checkpointing False and enable_activation_offloading False when absent;
  compile False; the distributed recipes shard every decoder layer and the root with FSDP2's fully_shard
  (fsdp_reshard_after_forward True, fsdp_cpu_offload False: CPUOffloadPolicy), data_parallel_shard_dim -1 (every
  rank the other dims leave), tensor_parallel_dim 1, context_parallel_dim 1, custom_sharded_layers None (the token
  embedding and the output head then stay in the root unit); optimizer_in_bwd False.
- `torchtune/models/*/_model_builders.py`: the `lora_*` builders take lora_attn_modules (q_proj, k_proj, v_proj,
  output_proj), apply_lora_to_mlp False, apply_lora_to_output False, lora_rank 8, lora_dropout 0.0, use_dora False,
  quantize_base False (the `qlora_*` builders: True: torchao's NF4Tensor, 4-bit blocks of 64 with 8-bit scalers
  in blocks of 256); the adapters are made in the model's dtype.
- `torchtune/modules/attention.py` MultiHeadAttention: keys and values expanded to every head before SDPA.
- `torchtune/modules/loss/cross_entropy_loss.py` LinearCrossEntropyLoss: the head applied per chunk of tokens (8).
Which recipe runs the file is a command-line choice: a file with a distributed recipe's own keys (fsdp_*,
custom_sharded_layers, *_parallel_dim) or without `_single_device` in its name is read as a distributed recipe
(FSDP2 over `tune run --nproc_per_node N`'s ranks, which the file does not hold: pass --gpus N).
"""

from __future__ import annotations

import re
from pathlib import Path

from helpers.readers import model_ref
from helpers.readers.base import ConfigError, Imported, did_you_mean, leaves, lookup, probability
from helpers.readers.provenance import Record, boolean, positive_int

NAME = "torchtune"
TOOL = "torchtune (commit bd2a0fc)"
SRC = "github:pytorch/torchtune@bd2a0fc recipes/"
BUILDERS = {
    "llama3_2_1b": "llama-3.2-1b", "llama3_2_3b": "llama-3.2-3b", "llama3_1_8b": "llama-3.1-8b",
    "llama3_1_70b": "llama-3.1-70b", "llama3_8b": "llama-3-8b",
    "qwen2_5_0_5b": "qwen2.5-0.5b", "qwen2_5_1_5b": "qwen2.5-1.5b", "qwen2_5_3b": "qwen2.5-3b",
    "qwen2_5_7b": "qwen2.5-7b", "qwen2_5_14b": "qwen2.5-14b", "qwen2_5_32b": "qwen2.5-32b",
    "qwen2_5_72b": "qwen2.5-72b", "qwen3_0_6b": "qwen3-0.6b", "qwen3_1_7b": "qwen3-1.7b", "qwen3_4b": "qwen3-4b",
    "qwen3_8b": "qwen3-8b", "qwen3_14b": "qwen3-14b", "qwen3_32b": "qwen3-32b",
    "gemma2_2b": "gemma-2-2b", "gemma2_9b": "gemma-2-9b", "gemma2_27b": "gemma-2-27b",
    "phi3_mini": "phi-3-mini", "phi4_14b": "phi-4",
}
ATTN_MODULES = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}
DISTRIBUTED_KEYS = ("fsdp_cpu_offload", "fsdp_reshard_after_forward", "custom_sharded_layers",
                    "data_parallel_shard_dim", "data_parallel_replicate_dim", "tensor_parallel_dim",
                    "context_parallel_dim", "tensor_parallel_plan")
SEQ_UNKNOWN = 2048
EIGHT_BIT = ("PagedAdamW8bit", "AdamW8bit", "Adam8bit")
NOT_MODELLED = {
    "quantizer": "quantization-aware training (fake-quantised weights and activations in forward) is not modelled: "
                 "the real figure is higher",
    "teacher_model": "knowledge distillation keeps a teacher model on the GPU beside the student: not modelled, the "
                     "real figure is higher",
    "kd_loss": "the distillation loss holds the teacher's logits too: not modelled, the real figure is higher",
    "ref_checkpointer": "full DPO keeps a reference model on the GPU: not modelled, the real figure is higher",
    "grpo_samples": "GRPO generates a group of completions per prompt and keeps a reference model: estimated as SFT of "
                    "the policy, the real figure is higher",
    "ac_mode": "selective activation checkpointing is estimated as enable_activation_checkpointing says",
    "memory_efficient_fsdp_wrap": "torchtune's memory-efficient FSDP wrapping (the embedding and head wrapped apart) "
                                  "is not modelled",
    "use_flex": "flex attention is not modelled: estimated with scaled_dot_product_attention",
}
READ = {"model._component_", "model.lora_attn_modules", "model.apply_lora_to_mlp", "model.apply_lora_to_output",
        "model.lora_rank", "model.lora_alpha", "model.lora_dropout", "model.use_dora", "model.quantize_base",
        "batch_size", "gradient_accumulation_steps", "dtype", "enable_activation_checkpointing",
        "enable_activation_offloading", "compile", "optimizer._component_", "optimizer.fused", "optimizer.foreach",
        "optimizer_in_bwd", "loss._component_", "tokenizer.max_seq_len", "dataset.packed", "device",
        "checkpointer.checkpoint_dir", "resume_from_checkpoint", *DISTRIBUTED_KEYS, *NOT_MODELLED}
MODEL_DIFFERENCES = (
    "torchtune's own TransformerDecoder is estimated with the catalogue's transformers rules plus its expanded keys "
    "and values (kv_expanded); its rotary embedding and norms are taken as transformers' (not checked by a dry run "
    "of torchtune itself)")


def claims(path: Path, data) -> bool:
    """A YAML mapping whose `model` (or another section) is built from a `_component_: torchtune...` path."""
    if Path(path).suffix.lower() not in (".yaml", ".yml") or not isinstance(data, dict):
        return False
    return any(isinstance(v, dict) and str(v.get("_component_", "")).startswith("torchtune.") for v in data.values())


INTERPOLATION = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")


def resolved(data: dict) -> dict:
    """`data` with each value that is a whole OmegaConf interpolation of another key (`lora_rank: ${batch_size}`)
    replaced by that key's value, as OmegaConf resolves it when the recipe reads it (absolute dotted paths; a resolver
    such as ${oc.env:X}, a relative path or an interpolation inside a longer text stays as written, and is named where
    a count or a switch is read)."""
    def lookup(key: str, seen: tuple):
        node = data
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return walk(node, seen + (key,)) if key not in seen else None

    def walk(value, seen=()):
        if isinstance(value, dict):
            return {k: walk(v, seen) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, seen) for v in value]
        m = INTERPOLATION.fullmatch(value) if isinstance(value, str) else None
        if m:
            got = lookup(m.group(1), seen)
            return value if got is None else got
        return value
    return walk(data)


def read(path: Path, data, lines: dict[str, int], given: list[Path]) -> Imported:
    data = resolved(data) if isinstance(data, dict) else data
    if "policy_model" in data:
        raise ConfigError(path, "a torchtune PPO config (policy_model, reward_and_value_model) is not read: "
                                "preference and RL runs are not modelled yet")
    missing = [k for k in ("model", "optimizer", "batch_size") if k not in data or (k == "model" and not isinstance(
        data.get("model"), dict))]
    import difflib

    near = {k: difflib.get_close_matches(k, [str(x) for x in data], n=1, cutoff=0.75) for k in missing}
    if any(near.values()):                   # a misspelt key, not another kind of config
        said = "; ".join(f"{k}" + (f" (is {near[k][0]} meant?)" if near[k] else "") for k in missing)
        raise ConfigError(path, f"a torchtune fine-tuning config without {said}: the full_finetune_* and "
                                f"lora_finetune_* recipes read model, optimizer and batch_size")
    if missing:
        raise ConfigError(path, "not a torchtune fine-tuning config (no model, optimizer or batch_size: an "
                                "evaluation, generation or quantization config?): only the configs of the "
                                "full_finetune_* and lora_finetune_* recipes are read")
    _refuse_misspelt(path, data)
    return _Reader(path, data, lines).read()


KNOWN = READ | {"output_dir", "tokenizer", "checkpointer", "dataset", "seed", "shuffle", "epochs", "max_steps_per_epoch",
                "clip_grad_norm", "metric_logger", "log_every_n_steps", "log_peak_memory_stats", "log_level",
                "profiler", "lr_scheduler", "save_adapter_weights_only", "run_val_every_n_steps", "dataset_val",
                "batch_size_val", "enable_async_checkpointing", "save_every_n_steps", "cudnn_deterministic_mode",
                "collate_fn", "low_cpu_ram", "activation_offloading_use_streams", "ac_option",
                "resize_token_embeddings", "enable_fp8_training", "fp8_recipe_name", "context_parallel_rotate_method",
                "teacher_checkpointer", "kd_ratio", "enable_kv_cache", "model.lora_alpha", "datasets"}


def _refuse_misspelt(path: Path, data: dict) -> None:
    """torchtune reads each key by name (cfg.get): a misspelt one (enable_activation_checkpoint, lora_rnak) is never
    read and the run trains at the default. A key within difflib's 0.88 of one the recipes or builders read is
    refused here, naming that key, instead of being listed as ignored."""
    import difflib

    known = {k for k in KNOWN if "." not in k} | {k.split(".", 1)[1] for k in KNOWN if k.startswith("model.")}
    keys = [(k, "") for k in data] + [(k, "model.") for k in (data.get("model") or {})
                                      if isinstance(data.get("model"), dict)]
    for key, where in keys:
        if str(key) in known or str(key).startswith("_"):
            continue
        near = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.88)
        if near:
            raise ConfigError(path, f"unknown key {where}{key!r}: did you mean {where}{near[0]!r}? (torchtune reads "
                                    f"keys by name, so this one would never be read; fix the spelling)")



def _omegaconf_bool(f, key: str, value) -> bool:
    """A torchtune switch: YAML true/false. OmegaConf keeps a quoted 'false' a string, which torchtune's recipes test
    for truth (`if cfg.enable_activation_checkpointing:`), so a quoted 'false' switches it on there: refused here
    with that said, rather than read either way."""
    if isinstance(value, str):
        raise ConfigError(f, f"{key} is the string {value!r}, which torchtune reads as "
                             f"{'true' if value else 'false'} (OmegaConf keeps quoted YAML a string, and the recipe "
                             f"tests it for truth): write true or false unquoted")
    return boolean(f, key, value)


def _number(f, key: str, value, allow_minus_one: bool = False) -> int:
    """A torchtune count: a YAML number. OmegaConf keeps a quoted '4' a string, which the recipe uses as a number and
    fails on (a batch size, a range), so it is refused here rather than read as 4."""
    plain = re.fullmatch(r"\$\{([A-Za-z_][\w.]*)\}", value) if isinstance(value, str) else None
    if plain:                                      # (one that names a key of the file was resolved before: `resolved`)
        raise ConfigError(f, f"{key} is {value!r}: it interpolates {plain.group(1)}, which the file does not have, "
                             f"and OmegaConf stops the run (InterpolationKeyError); write the number")
    if isinstance(value, str) and "${" in value:
        raise ConfigError(f, f"{key} is {value!r}: an OmegaConf interpolation not resolved here (a resolver or a "
                             f"relative path); write the number")
    if isinstance(value, str):
        raise ConfigError(f, f"{key} is the string {value!r}: torchtune keeps quoted YAML a string (OmegaConf) and the "
                             f"recipe fails on it; write the number unquoted")
    return positive_int(f, key, value, allow_minus_one=allow_minus_one)


def _check_kwargs(path, section: str, component: str, values) -> None:
    """ConfigError for a key of `section` the component's class does not take: torchtune's config.instantiate calls
    it with the section's keys (less _component_), and Python refuses an unexpected keyword. Checked where the class
    is importable here (torch.optim's, bitsandbytes'); another is left to its own run."""
    import importlib
    import inspect

    module, _, cls = component.rpartition(".")
    values = values if isinstance(values, dict) else {}
    if not module.startswith(("torch.optim", "bitsandbytes.optim")):
        return
    try:
        found = importlib.import_module(module)
    except ImportError:
        return
    if not hasattr(found, cls):
        raise ConfigError(path, f"{section}._component_ {component!r}: {module} has no {cls} (torchtune's instantiate "
                                f"cannot import it, and the run stops)"
                          + did_you_mean(cls, [n for n in dir(found) if n[:1].isupper()], prefix=f"{module}."))
    try:
        params = inspect.signature(getattr(found, cls)).parameters
    except (ValueError, TypeError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    allowed = [n for n in params if n != "params"]
    for key in values:
        if key != "_component_" and key not in allowed:
            raise ConfigError(path, f"{section}.{key}: {cls} takes no argument {key!r} (torchtune's instantiate "
                                    f"passes it on, and the run stops)" + did_you_mean(key, allowed, prefix=f"{section}."))


class _Reader:
    def __init__(self, path: Path, data: dict, lines: dict):
        self.path, self.data, self.lines = Path(path), data, lines
        self.d = Record(NAME, path, lines)

    def value(self, key: str, default):
        """(present, value): the file's value of a dotted key, or the recipe's default."""
        return lookup(self.data, key, default)

    def required(self, key: str, example: str) -> None:
        """The fine-tuning recipes read `key` as an attribute (cfg.dtype, cfg.gradient_accumulation_steps,
        cfg.resume_from_checkpoint in recipes/{lora,full}_finetune_{single_device,distributed}.py @bd2a0fc), and
        OmegaConf raises on a missing key, so a file without it stops the run at start-up (the dev GRPO recipe's
        files, with max_seq_length, are read otherwise)."""
        if key not in self.data and "max_seq_length" not in self.data:
            raise ConfigError(self.path, f"no {key}: torchtune's fine-tuning recipes read cfg.{key}, and OmegaConf "
                                         f"stops the run on a missing key ('Missing key {key}'); write e.g. {example}")

    def read(self) -> Imported:
        model, named = self.model()
        self.run_kind()
        self.engine()
        self.sizes()
        self.precision()
        self.lora(model)
        self.memory()
        self.optimizer()
        self.loss()
        d = self.d
        d.default(TOOL, "attention", "sdpa", "torchtune/modules/attention_utils.py _sdpa_or_flex_attention: torch's "
                  "scaled_dot_product_attention (flash on a GPU that has it)", attention="flash")
        if d.fields.get("tensor_parallel", 1) * d.fields.get("context_parallel", 1) > 1:
            d.unmodelled("(attention)", "keys and values expanded", "torchtune's MultiHeadAttention expands keys and "
                         "values to every head before SDPA; with tensor or context parallelism that is not modelled: "
                         "estimated grouped, the real figure is higher by the copies")
        else:
            d.default(TOOL, "(attention)", "keys and values expanded", "torchtune/modules/attention.py "
                      "MultiHeadAttention: k and v expanded to every head (expand + flatten, a copy) before SDPA, "
                      "which saves the copies", kv_expanded=True)
        d.unmodelled("(torchtune's model)", "torchtune.modules.TransformerDecoder", MODEL_DIFFERENCES)
        for key, why in NOT_MODELLED.items():
            if self.data.get(key) not in (None, False):
                d.unmodelled(key, self.data[key] if not isinstance(self.data[key], dict) else
                             self.data[key].get("_component_", "(a mapping)"), why)
        for key, v in leaves(self.data):
            if key not in READ and key.split(".")[0] not in NOT_MODELLED:
                d.ignore(key, v)
        return d.finish(model, named)

    def model(self):
        d, f = self.d, self.path
        present, component = self.value("model._component_", None)
        if not isinstance(component, str) or not component.startswith("torchtune.models."):
            raise ConfigError(f, f"model._component_ must be a torchtune.models builder, got {component!r}")
        builder = component.rsplit(".", 1)[-1]
        self.method = "qlora" if builder.startswith("qlora_") else "lora" if builder.startswith("lora_") else "full"
        base = re.sub(r"^(q?lora_)", "", builder)
        if base.startswith(("qwen2_5_", "qwen3_")):                 # (their builders come as _base and _instruct)
            base = re.sub(r"_(base|instruct)$", "", base)
        model = BUILDERS.get(base)
        _, ckpt = self.value("checkpointer.checkpoint_dir", None)
        if model is None and isinstance(ckpt, str) and Path(ckpt).expanduser().is_dir():
            model, _ = model_ref.resolve(ckpt, f, "checkpointer.checkpoint_dir")
        d.set("model._component_", component, sets=f"model={model!r}" + (
            f" ({self.method})" if self.method != "full" else " (full fine-tuning)") if model else
            f"model=None ({builder!r}: no builder whose shapes the catalogue holds: pass --model)")
        return model, component

    def run_kind(self) -> None:
        """A preference loss (DPO) read as SFT would be misread: listed (distillation and QAT keys: NOT_MODELLED)."""
        _, loss = self.value("loss._component_", "")
        if isinstance(loss, str) and ".rlhf." in loss:
            self.d.unmodelled("loss._component_", loss, "a preference loss (DPO/PPO: a reference model, chosen and "
                                                        "rejected sequences) is not modelled: estimated as SFT")

    def engine(self) -> None:
        d, f = self.d, self.path
        distributed = any(k in self.data for k in DISTRIBUTED_KEYS)
        self.distributed = distributed
        d.more_gpus = "fsdp2"
        method = "lora" if self.method != "full" else "full"
        if not distributed:
            d.default(TOOL, "(recipe)", f"{method}_finetune_single_device or _distributed",
                      "the recipe is a command-line choice and the file has no distributed key: one GPU (a "
                      "distributed recipe on one rank applies no FSDP either); --gpus N reads it as "
                      f"{method}_finetune_distributed (FSDP2 over tune run --nproc_per_node N)",
                      sets="strategy='single' (--gpus N: FSDP2)", strategy="single")
            return
        dims = {}
        for key, default in (("data_parallel_shard_dim", -1), ("data_parallel_replicate_dim", 1),
                             ("tensor_parallel_dim", 1), ("context_parallel_dim", 1)):
            present, v = self.value(key, default)
            dims[key] = _number(f, key, v, allow_minus_one=key == "data_parallel_shard_dim")
            if present:
                d.set(key, v, sets="read")
        others = dims["data_parallel_replicate_dim"] * dims["tensor_parallel_dim"] * dims["context_parallel_dim"]
        fields = {"strategy": "fsdp2"}
        if dims["tensor_parallel_dim"] > 1:
            fields["tensor_parallel"] = dims["tensor_parallel_dim"]
        if dims["context_parallel_dim"] > 1:
            fields["context_parallel"] = dims["context_parallel_dim"]
        if dims["data_parallel_shard_dim"] != -1:
            fields["gpus"] = dims["data_parallel_shard_dim"] * others
        d.default(TOOL, "(recipe)", f"{'lora' if self.method != 'full' else 'full'}_finetune_distributed",
                  "the file has a distributed recipe's keys or no single_device in its name: FSDP2's fully_shard "
                  "on every decoder layer and the root; the ranks are tune run --nproc_per_node's", **fields)
        d.default(TOOL, "(training loop)", "reduce-scatter every micro batch", "recipes/full_finetune_distributed.py "
                  "and lora_finetune_distributed.py: each micro batch's backward runs with gradient sync on (no "
                  "no_sync), so sharded gradients accumulate", sync_each_batch=True)
        rep = dims["data_parallel_replicate_dim"]
        if rep > 1 and "gpus" in fields:      # training/_distributed.py ParallelDims: a (dp_replicate, dp_shard) mesh
            d.set("data_parallel_replicate_dim", rep, dp_replicate=rep,
                  sets=f"dp_replicate={rep} (HSDP: {rep} groups, each sharding over data_parallel_shard_dim GPUs)")
        elif rep > 1:
            d.unmodelled("data_parallel_replicate_dim", rep,
                         f"HSDP with data_parallel_shard_dim -1 (the ranks left) needs the world size: pass --gpus N "
                         f"--dp-replicate {rep}; without it the estimate shards over every rank, which holds less per "
                         f"GPU than one replica's shards")
        present, offload = self.value("fsdp_cpu_offload", False)
        offload = _omegaconf_bool(f, "fsdp_cpu_offload", offload)
        if present:
            d.set("fsdp_cpu_offload", offload, offload_params=offload, offload_optimizer=offload)
        present, reshard = self.value("fsdp_reshard_after_forward", True)
        if not _omegaconf_bool(f, "fsdp_reshard_after_forward", reshard):
            d.set("fsdp_reshard_after_forward", reshard, reshard_after_forward=False,
                  sets="reshard_after_forward=False (every layer's gathered weights kept from forward to backward)")
        present, layers = self.value("custom_sharded_layers", None)
        if not layers:
            d.unmodelled("custom_sharded_layers", layers, "without it the token embedding and the output head are "
                                                          "in the root FSDP unit, which torchtune shards with "
                                                          "reshard_after_forward=False (training/_distributed.py "
                                                          "shard_model): both stay gathered from forward through "
                                                          "backward, where the modelled units reshard them: the real "
                                                          "figure is higher by the gathered embedding and head")
        else:
            d.set("custom_sharded_layers", layers, sets="the embedding and head sharded apart (as modelled)")

    def sizes(self) -> None:
        d, f = self.d, self.path
        present, batch = self.value("batch_size", None)
        if not present:
            raise ConfigError(f, "no batch_size: the recipes read cfg.batch_size")
        d.set("batch_size", batch, batch=_number(f, "batch_size", batch))
        self.required("gradient_accumulation_steps", "gradient_accumulation_steps: 1")
        present, accum = self.value("gradient_accumulation_steps", 1)
        accum = _number(f, "gradient_accumulation_steps", accum)
        (d.set("gradient_accumulation_steps", accum, grad_accum=accum) if present else
         d.default(TOOL, "gradient_accumulation_steps", 1, SRC, grad_accum=1))
        present, seq = self.value("tokenizer.max_seq_len", None)
        if seq is None and isinstance(self.data.get("max_seq_length"), int):      # (the dev GRPO configs)
            present, seq = True, self.data["max_seq_length"]
        _, packed = self.value("dataset.packed", False)
        if seq is None:
            if packed:
                raise ConfigError(f, "dataset.packed needs tokenizer.max_seq_len (torchtune packs to it)")
            d.default("not in the files", "tokenizer.max_seq_len", None,
                      "null: no truncation, each batch is as long as its longest sample; the estimate takes "
                      f"{SEQ_UNKNOWN} tokens: pass --seq N for your data's longest sample", seq=SEQ_UNKNOWN,
                      sets=f"seq={SEQ_UNKNOWN} assumed: pass --seq N (your longest sample)")
        else:
            seq = _number(f, "tokenizer.max_seq_len", seq)
            d.set("tokenizer.max_seq_len", seq, seq=seq,
                  sets=f"seq={seq} ({'packed to it' if packed else 'the cap: batches are padded to their longest'})")

    def precision(self) -> None:
        d, f = self.d, self.path
        self.required("dtype", "dtype: bf16")
        present, dtype = self.value("dtype", None)
        if dtype not in ("bf16", "fp32", None):
            raise ConfigError(f, f"dtype must be bf16 or fp32 (torchtune refuses fp16 training), got {dtype!r}")
        if dtype is None:
            d.default(TOOL, "dtype", "fp32", "torchtune/training/precision.py get_dtype(None): torch.float32",
                      precision="fp32")
        else:
            d.set("dtype", dtype, precision="bf16" if dtype == "bf16" else "fp32",
                  sets="precision='bf16' (weights, gradients and AdamW states all bf16)" if dtype == "bf16" else None)

    def lora(self, model: str | None) -> None:
        d, f = self.d, self.path
        if self.method == "full":
            return
        present, r = self.value("model.lora_rank", 8)
        r = _number(f, "model.lora_rank", r)
        (d.set("model.lora_rank", r, lora_rank=r) if present else
         d.default(TOOL, "model.lora_rank", r, "torchtune lora builders: lora_rank=8", lora_rank=r))
        present, p = self.value("model.lora_dropout", 0.0)
        p = probability(f, "model.lora_dropout", p)
        (d.set("model.lora_dropout", p, lora_dropout=p) if present else
         d.default(TOOL, "model.lora_dropout", p, "torchtune lora builders: lora_dropout=0.0", lora_dropout=p))
        _, attn = self.value("model.lora_attn_modules", None)
        if not isinstance(attn, list) or not attn or any(a not in ATTN_MODULES for a in attn):
            raise ConfigError(f, f"model.lora_attn_modules must be a list of {', '.join(ATTN_MODULES)}, got {attn!r}")
        targets = [ATTN_MODULES[a] for a in attn]
        _, mlp = self.value("model.apply_lora_to_mlp", False)
        if _omegaconf_bool(f, "model.apply_lora_to_mlp", mlp):
            targets += ["gate_proj", "up_proj", "down_proj"]
        joined = ",".join(model_ref.module_names(targets, model))
        d.set("model.lora_attn_modules", attn, lora_targets=joined,
              sets=f"lora_targets={joined!r} (with apply_lora_to_mlp {bool(mlp)})")
        _, head = self.value("model.apply_lora_to_output", False)
        if _omegaconf_bool(f, "model.apply_lora_to_output", head):
            d.unmodelled("model.apply_lora_to_output", head, "an adapter on the output head is not modelled (its "
                                                             "input and gradients add to the figure)")
        _, dora = self.value("model.use_dora", False)
        if _omegaconf_bool(f, "model.use_dora", dora):
            d.unmodelled("model.use_dora", dora, "DoRA's magnitude vector and weight norm per adapted layer are not "
                                                 "modelled: the real figure is higher")
        if not self.distributed and self.d.fields.get("precision") == "bf16":
            d.default(TOOL, "(LoRA adapters)", "the model's dtype", "torchtune builds the model, adapters included, "
                      "under the recipe's dtype", adapter_dtype="bf16")
        present, quant = self.value("model.quantize_base", self.method == "qlora")
        if _omegaconf_bool(f, "model.quantize_base", quant):
            d.set("model.quantize_base" if present else "model._component_", quant if present else
                  self.data["model"]["_component_"], base_weights="nf4-dq",
                  sets="base_weights='nf4-dq' (torchao's NF4: 4-bit, blocks of 64, scalers quantised to 8 bits in "
                       "blocks of 256; estimated as bitsandbytes' nf4 with double quantisation, the same layout in "
                       "bytes)")

    def memory(self) -> None:
        d, f = self.d, self.path
        present, ac = self.value("enable_activation_checkpointing", False)
        ac = _omegaconf_bool(f, "enable_activation_checkpointing", ac)
        (d.set("enable_activation_checkpointing", ac, checkpointing="full" if ac else "none") if present else
         d.default(TOOL, "enable_activation_checkpointing", False, SRC, checkpointing="none"))
        for key, why in (("enable_activation_offloading", "activations offloaded to host memory between forward and "
                                                          "backward are not modelled: the real figure is lower"),
                         ("compile", "torch.compile's fusions change the saved activations: estimated eager"),
                         ("optimizer_in_bwd", "the optimizer step inside backward (each gradient freed as it is "
                                              "applied) is not modelled: the real figure is lower")):
            present, v = self.value(key, False)
            if present and _omegaconf_bool(f, key, v):
                d.unmodelled(key, v, why)
            elif present:
                d.set(key, v, sets="off (as modelled)")
        self.required("resume_from_checkpoint", "resume_from_checkpoint: False")
        present, resume = self.value("resume_from_checkpoint", False)
        if present and _omegaconf_bool(f, "resume_from_checkpoint", resume):
            d.set("resume_from_checkpoint", resume, resume=True)

    def optimizer(self) -> None:
        d, f = self.d, self.path
        present, name = self.value("optimizer._component_", None)
        if not isinstance(name, str):
            raise ConfigError(f, f"optimizer._component_ must be an optimizer's class path, got {name!r}")
        short = name.rsplit(".", 1)[-1]
        _check_kwargs(f, "optimizer", name, self.data.get("optimizer"))
        if short in EIGHT_BIT:
            d.set("optimizer._component_", name, optimizer="adamw-8bit")
            return
        if short not in ("AdamW", "Adam", "PagedAdamW"):
            d.unmodelled("optimizer._component_", name, "only AdamW (torch's, or an 8-bit one) is modelled: "
                                                        "estimated as AdamW")
            return
        _, fused = self.value("optimizer.fused", None)
        _, foreach = self.value("optimizer.foreach", None)
        impl = "fused" if fused is True else "for-loop" if foreach is False else "foreach"
        d.set("optimizer._component_", name, optimizer="adamw", adam_impl=impl,
              sets=f"optimizer='adamw', adam_impl={impl!r}" + (" (optimizer.fused)" if fused else
                                                               " (torch's default on CUDA)"))
        if short == "PagedAdamW":
            d.unmodelled("optimizer._component_", name, "bitsandbytes' paged AdamW keeps its fp32 states in CUDA "
                                                        "unified memory: estimated as torch's AdamW on the GPU")

    def loss(self) -> None:
        d = self.d
        present, loss = self.value("loss._component_", None)
        if not present:
            return
        short = str(loss).rsplit(".", 1)[-1]
        if short == "LinearCrossEntropyLoss":
            d.unmodelled("loss._component_", loss, "the head and cross-entropy per chunk of tokens (8 chunks): the "
                                                   "whole bf16 logits are never held, so the real figure is lower "
                                                   "than the modelled transformers loss")
        elif short == "CEWithChunkedOutputLoss":
            d.set("loss._component_", loss, sets="the logits in chunks, each upcast to fp32 for its cross-entropy "
                                                 "(as modelled: the whole logits and their fp32 copy)")
        elif ".rlhf." not in str(loss):
            d.unmodelled("loss._component_", loss, "a loss other than cross-entropy is not modelled")
