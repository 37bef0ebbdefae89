"""axolotl's training YAML (`axolotl train run.yaml`), with the DeepSpeed JSON its `deepspeed:` key names.

Source read (keys, defaults, how values are resolved): github:axolotl-ai-cloud/axolotl at 067b021c (v0.18.0-9,
2026-07-24): `src/axolotl/utils/schemas/config.py` (sequence_len 512, bf16 "auto", gradient_checkpointing false and
its "offload"/"offload_disk" variants, attn_implementation and the deprecated flash_attention/sdp_attention,
deepspeed, fsdp/fsdp_config/fsdp_version, context_parallel_size, plugins), `schemas/training.py` (micro_batch_size 1,
gradient_accumulation_steps 1, optimizer "adamw_torch_fused"), `schemas/peft.py` (adapter, lora_r,
lora_target_modules, lora_target_linear, load_in_4bit/8bit), `schemas/fsdp.py` and `schemas/validation.py`
(`check_fsdp_config_kwargs_prefix`: the old `fsdp_`-prefixed keys inside fsdp_config are the new keys without the
prefix; `_resolve_fsdp_version`: 1 when neither fsdp_version nor fsdp_config.fsdp_version is given),
`src/axolotl/loaders/adapter.py` (LoRA targets: lora_target_modules plus every linear layer with lora_target_linear),
`integrations/liger/args.py` (liger_fused_linear_cross_entropy), `integrations/cut_cross_entropy/args.py`
(cut_cross_entropy, default true once the plugin is on), `deepspeed_configs/zero3_bf16.json`. The older "unsloth"
value of gradient_checkpointing (v0.6.0's schema, `utils/config/models/input/v0_4_1`) is refused, as 0.18 refuses it.
"""

from __future__ import annotations

import re
from pathlib import Path

from helpers import strategies
from helpers.estimate import loading
from helpers.models import LINEAR_NAMES
from helpers.readers import accelerate, base, collect, hf_names, model_ref
from helpers.readers.base import (
    ConfigError,
    Imported,
    companion,
    did_you_mean,
    load_json,
    peft_names,
    peft_regex,
    probability,
)
from helpers.readers.provenance import Record, boolean, model_from, positive_int
from helpers.training import COMPLETION_DEFAULT, PROMPT_ASSUMED

NAME = "axolotl"
TOOL = "axolotl 0.18.0 (067b021c)"
SRC = "github:axolotl-ai-cloud/axolotl src/axolotl/utils/schemas/{file} @067b021c"
LIGER = "axolotl.integrations.liger.LigerPlugin"
CCE = "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"
ATTENTION = hf_names.ATTENTION
# schemas/enums.py @067b021c: RLType, and CustomSupportedOptimizers (axolotl's own, beside transformers' optim names)
RL_TYPES = ("dpo", "gdpo", "grpo", "ipo", "orpo", "kto", "simpo", "ebft")
CUSTOM_OPTIMIZERS = ("optimi_adamw", "ao_adamw_4bit", "ao_adamw_8bit", "ao_adamw_fp8", "adopt_adamw", "came_pytorch",
                     "muon", "dion", "sinkgd", "flash_adamw", "flash_adam", "flash_sgd", "flash_sgdw", "flash_lion",
                     "q_galore_adamw8bit")
# keys a reader of memory needs: every one is read below; anything else is listed as ignored.
FSDP_KEYS = ("offload_params", "activation_checkpointing", "sharding_strategy", "reshard_after_forward",
             "cpu_offload_pin_memory", "fsdp_version", "version", "state_dict_type", "cpu_ram_efficient_loading",
             "use_orig_params")


HEAD_WHY = ("a sequence-classification model (a score head of num_labels outputs instead of the LM head): the estimate "
            "counts the LM head and its full-vocabulary logits, so the real figure is lower")
# (key, why): memory-relevant keys of axolotl's schema that the estimate does not model (schemas/config.py, peft.py
# @067b021c); each is listed when set, with the direction the real figure lies in.
EXTRAS = (
    ("lora_modules_to_save", "modules trained in full beside LoRA (PEFT keeps a trainable copy of each, with its "
                             "gradient and optimizer states, beside the frozen original): not modelled, the real "
                             "figure is higher"),
    ("unfrozen_parameters", "only the parameters these patterns match are trained (the rest frozen): not modelled, "
                            "estimated with every parameter trained, so the real figure is lower"),
    ("qat", "quantisation-aware training (torchao fake-quantised weights and activations, their scales and copies) is "
            "not modelled: the real figure is higher"),
    ("tiled_mlp", "the MLP computed in tiles along the sequence (ALST) holds less than one whole MLP's activations: "
                  "not modelled, the real figure is lower"),
    ("reward_model", ""),                                                         # (read: run=rm)
    ("process_reward_model", "process reward modelling (token classification): " + HEAD_WHY),
    ("model_type", HEAD_WHY),
    ("num_labels", HEAD_WHY),
    ("fp8", "torchao float8 training (fp8 matmuls, their scales and casts) is not modelled: estimated in bf16"),
    ("fp8_enable_fsdp_float8_all_gather", "float8 all-gather of FSDP's parameters is not modelled"),
    ("torch_compile", "torch.compile changes which activations are saved (fused kernels, its own recomputation): "
                      "not modelled, estimated as eager PyTorch"),
)


def _sequence_classifier(data: dict) -> bool:
    return bool(data.get("reward_model") or data.get("process_reward_model")
                or "SequenceClassification" in str(data.get("model_type") or "")
                or "TokenClassification" in str(data.get("model_type") or ""))


def claims(path: Path, data) -> bool:
    """A YAML mapping with axolotl's model key, base_model (LLaMA-Factory and TRL say model_name_or_path)."""
    return Path(path).suffix.lower() in (".yaml", ".yml") and isinstance(data, dict) and "base_model" in data


def _deepspeed(path: Path, ref, given: list[Path], trainer: dict, hidden: int | None, lines: dict):
    """The DeepSpeed config the YAML names (a JSON path, or inline under `deepspeed:`), laid over axolotl's trainer
    values by the DeepSpeed reader (`helpers.readers.deepspeed.apply`, shared by every reader whose tool hands a
    DeepSpeed config to the HF Trainer). Returns the file it came from and what it changes."""
    from helpers.readers import deepspeed

    if isinstance(ref, dict):                                 # inline: the YAML's own lines, without the prefix
        inline = {k[len("deepspeed."):]: n for k, n in lines.items() if k.startswith("deepspeed.")}
        return Path(path), deepspeed.apply(path, ref, inline, trainer, hidden=hidden)
    ds_path = companion(ref, path, given, "DeepSpeed config")
    data, ds_lines = load_json(ds_path)
    return ds_path, deepspeed.apply(ds_path, data, ds_lines, trainer, hidden=hidden)


# axolotl's schema fields of type bool (or bool beside a few words) that change memory: pydantic reads a quoted
# 'false', 'no', 'off', '0' as False (lax mode), so the reader does too (`pydantic_bools`)
BOOL_KEYS = ("fp16", "bf16", "bfloat16", "float16", "tf32", "flash_attention", "sdp_attention", "eager_attention",
             "xformers_attention", "s2_attention", "flex_attention", "reward_model", "process_reward_model",
             "liger_fused_linear_cross_entropy", "liger_cross_entropy", "liger_rms_norm", "liger_glu_activation",
             "liger_rope", "liger_layer_norm", "cut_cross_entropy", "load_in_4bit", "load_in_8bit",
             "lora_target_linear", "gradient_checkpointing", "sample_packing", "pad_to_sequence_len",
             "flash_attn_cross_entropy", "unfrozen_parameters_only", "adapter_only")
PYDANTIC_WORDS = {"true": True, "t": True, "yes": True, "y": True, "on": True, "1": True,
                  "false": False, "f": False, "no": False, "n": False, "off": False, "0": False}


def pydantic_bools(path: Path, data: dict) -> dict:
    """`data` with the quoted booleans of BOOL_KEYS read as pydantic's lax bool reads them; other words kept (bf16
    'auto', gradient_checkpointing 'unsloth'), for the reader to accept or refuse by name."""
    out = dict(data)
    for key in BOOL_KEYS:
        value = out.get(key)
        if isinstance(value, str) and value.strip().lower() in PYDANTIC_WORDS:
            out[key] = PYDANTIC_WORDS[value.strip().lower()]
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and value in (0, 1):
            out[key] = bool(value)                                  # pydantic's lax bool: 0 and 1
        elif value is not None and not isinstance(value, (bool, str)):
            words = BOOL_WORDS.get(key, ())
            raise ConfigError(path, f"{key} must be true or false{''.join(f' or {w!r}' for w in words)} (axolotl's "
                                    f"schema refuses anything else), got {value!r}")
    for key in INT_KEYS:                            # pydantic's lax int: 4.0 and '4' are 4
        value = out.get(key)
        if isinstance(value, str) and re.fullmatch(r"\s*[+-]?[0-9_]+(\.0*)?\s*", value):
            value = float(value.replace("_", ""))                  # 4.0, +4, 4_0 as text
        if isinstance(value, float) and value.is_integer():
            out[key] = int(value)
    return out


# the words axolotl's schema takes beside a bool (schemas/training.py, config.py: Literal[...] | bool | None)
BOOL_WORDS = {"bf16": ("auto",), "tf32": ("auto",), "gradient_checkpointing": ("offload", "offload_disk")}
INT_KEYS = ("micro_batch_size", "sequence_len", "gradient_accumulation_steps", "batch_size", "lora_r",
            "context_parallel_size", "tensor_parallel_size", "fsdp_version")


class _Reader:
    def __init__(self, path: Path, data: dict, lines: dict, given: list[Path]):
        self.path, self.data, self.lines, self.given = Path(path), pydantic_bools(Path(path), data), lines, given
        self.d = Record(NAME, path)
        self.used: set[str] = set()

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def take(self, key: str, default=None):
        if key in self.data:
            self.used.add(key)
        return self.data.get(key, default) if self.data.get(key) is not None else default

    def line(self, key):
        return self.lines.get(key)

    def at(self, key: str) -> str:
        return f"{self.path.name} line {self.line(key)}" if self.line(key) else f"{self.path.name}"

    def read(self) -> Imported:
        d = self.d
        model, named = self.model()
        self.catalogue_model = model
        self.sizes()
        self.precision()
        strategy = self.parallel()
        self.replicas(strategy)
        self.checkpointing()
        self.attention()
        self.lora(strategy)
        self.plugins()
        self.rl()
        self.extras()
        ds = self.take("deepspeed")
        if ds is not None:
            self.apply_deepspeed(ds, model)
        elif "gpus" not in d.fields:
            d.gpus_unknown()
        self.optimizer(d.fields.get("strategy", strategy))      # after the DeepSpeed config: whether it brings its own
        for key, value in self.data.items():
            if key not in self.used and not collect.saves(d, key, value, self.line(key)):
                d.ignored_at(self.path, self.line(key), key, value)
        return d.finish(model, named)

    def model(self):
        d, f = self.d, self.path
        named = self.take("base_model")
        if not isinstance(named, str) or not named:
            raise ConfigError(f, f"base_model must be a hub id or a path, got {named!r}")
        config = self.take("base_model_config")
        model = model_from(config, f, "base_model_config") if isinstance(config, str) else None
        model = model or model_from(named, f, "base_model")
        d.setting(f, self.line("base_model"), "base_model", named,
                  sets=model_ref.sets_words(model))
        if config is not None:
            d.setting(f, self.line("base_model_config"), "base_model_config", config, sets=f"model={model!r}")
        return model, named

    def sizes(self):
        d, f = self.d, self.path
        for key, field, default, src in (("micro_batch_size", "batch", 1, "training.py"),
                                         ("sequence_len", "seq", 512, "config.py"),
                                         ("gradient_accumulation_steps", "grad_accum", 1, "training.py")):
            if self.has(key):
                v = positive_int(f, key, self.take(key))
                d.setting(f, self.line(key), key, v, **{field: v})
            else:
                self.used.add(key)
                d.default(TOOL, key, default, SRC.format(file=src), **{field: default})
        self.micro = d.fields["batch"]
        if self.has("batch_size"):
            if self.data.get("gradient_accumulation_steps"):     # schemas/validation.py check_gas_bsz
                raise ConfigError(f, "batch_size beside gradient_accumulation_steps: axolotl refuses the pair ('please "
                                     "set only one of gradient_accumulation_steps or batch_size'); keep one")
            v = positive_int(f, "batch_size", self.take("batch_size"))
            d.unmodelled_at(f, self.line("batch_size"), "batch_size", v, "the total batch (deprecated): axolotl "
                           "derives gradient_accumulation_steps from it and the world size; give "
                           "gradient_accumulation_steps instead")
        if self.has("sample_packing"):
            on = boolean(f, "sample_packing", self.take("sample_packing"))
            d.setting(f, self.line("sample_packing"), "sample_packing", on,
                      sets="modelled as micro_batch_size x sequence_len tokens (a packed bin holds at most that)"
                      if on else "no packing (as modelled)")

    def precision(self):
        d, f = self.d, self.path
        bf16 = self.take("bf16", "auto") if "bf16" in self.data else "auto"
        fp16 = self.take("fp16")
        pure_bf16 = self.take("bfloat16")
        if "tf32" in self.data:
            d.setting(f, self.line("tf32"), "tf32", self.take("tf32"), sets="matmul precision only: no memory effect")
        if pure_bf16:
            d.setting(f, self.line("bfloat16"), "bfloat16", True, precision="bf16")
        elif fp16:
            d.setting(f, self.line("fp16"), "fp16", True, precision="fp16-mixed")
        elif bf16 in (True, "auto", "full"):
            if "bf16" in self.data:
                d.setting(f, self.line("bf16"), "bf16", bf16, precision="bf16-mixed",
                          sets="precision='bf16-mixed'" + (" (auto: bf16 on Ampere or newer GPUs)" if bf16 == "auto"
                                                           else ""))
            else:
                d.default(TOOL, "bf16", "auto", SRC.format(file="config.py") + " (auto: bf16 where the GPU supports "
                          "it, Ampere or newer)", precision="bf16-mixed")
        elif bf16 is False:
            d.setting(f, self.line("bf16"), "bf16", False, precision="fp32")
        else:
            raise ConfigError(f, f"bf16 must be true, false or auto, got {bf16!r}")
        self.trainer_bf16 = (bool(bf16) if bf16 != "auto" else True, self.at("bf16") if "bf16" in self.data
                             else f"{TOOL} default auto")
        self.trainer_fp16 = (bool(fp16), self.at("fp16") if "fp16" in self.data else f"{TOOL} default")

    def parallel(self) -> str:
        """Strategy from fsdp/fsdp_config (DeepSpeed's comes later from its file); context and tensor parallel."""
        d, f = self.d, self.path
        old = self.take("fsdp")
        cfg = self.take("fsdp_config") or {}
        if not isinstance(cfg, dict):
            raise ConfigError(f, f"fsdp_config must be a mapping, got {cfg!r}")
        for key in ("context_parallel_size", "sequence_parallel_degree"):
            if self.has(key):
                v = positive_int(f, key, self.take(key))
                d.setting(f, self.line(key), key, v, context_parallel=v)
        if self.has("tensor_parallel_size"):
            v = positive_int(f, "tensor_parallel_size", self.take("tensor_parallel_size"))
            d.setting(f, self.line("tensor_parallel_size"), "tensor_parallel_size", v, tensor_parallel=v)
        self.world_size()
        if self.has("fsdp_version"):
            self.take("fsdp_version")
        if not old and not cfg:
            if not self.has("deepspeed"):
                d.default(TOOL, "deepspeed / fsdp", None, "neither is set: one GPU, or torch DDP when launched on "
                          "several (pass --gpus N --strategy ddp)", strategy="single")
            return "single"
        # both key styles: fsdp_offload_params (old, prefixed) and offload_params (new)
        plain = {}
        for key, value in cfg.items():
            name = key[len("fsdp_"):] if key.startswith("fsdp_") and key != "fsdp_version" else key
            plain[name] = (key, value)
        in_config = plain.get("fsdp_version") or plain.get("version") or (None, None)
        version = self.data.get("fsdp_version") or in_config[1]
        vkey = "fsdp_version" if self.has("fsdp_version") else next(
            (f"fsdp_config.{k}" for k in ("fsdp_version", "version") if k in cfg), None)
        if version is None:
            version = 1
            d.default(TOOL, "fsdp_version", 1, SRC.format(file="validation.py") + " (_resolve_fsdp_version)",
                      sets="FSDP1")
        if str(version) not in ("1", "2"):
            raise ConfigError(f, f"fsdp_version must be 1 or 2, got {version!r}")
        if str(version) == "2":
            strategy = "fsdp2"
            accelerate.reduce_in_bf16(d)              # axolotl hands FSDP to accelerate's plugin
            if vkey:
                d.setting(f, self.line(vkey), vkey, version, strategy="fsdp2")
        else:
            strategy = "fsdp1"
            if vkey:
                d.setting(f, self.line(vkey), vkey, version, strategy="fsdp1")
        d.fields["strategy"] = strategy
        if old:
            words = old if isinstance(old, list) else str(old).split()
            d.setting(f, self.line("fsdp"), "fsdp", old, sets=f"strategy={strategy!r}", strategy=strategy)
            if "offload" in words:
                plain.setdefault("offload_params", ("fsdp: offload", True))
            if "shard_grad_op" in words:
                plain.setdefault("sharding_strategy", ("fsdp: shard_grad_op", "SHARD_GRAD_OP"))
        ck = lambda k: f"fsdp_config.{k}"
        if "offload_params" in plain:
            key, v = plain["offload_params"]
            v = boolean(f, key, v)
            d.setting(f, self.line(ck(key)) or self.line("fsdp"), key if key.startswith("fsdp:") else ck(key), v,
                      offload_optimizer=v, offload_params=v)
        if "cpu_offload_pin_memory" in plain:
            key, v = plain["cpu_offload_pin_memory"]
            d.setting(f, self.line(ck(key)), ck(key), v, pin_memory=boolean(f, key, v))
        if "activation_checkpointing" in plain:
            key, v = plain["activation_checkpointing"]
            if boolean(f, key, v):
                d.setting(f, self.line(ck(key)), ck(key), True, checkpointing="full")
                self.fsdp_ac = True
        if "sharding_strategy" in plain:
            key, v = plain["sharding_strategy"]
            name = str(v).upper().replace("SHARDINGSTRATEGY.", "")
            if name.isascii() and name.isdigit():
                name = {"1": "FULL_SHARD", "2": "SHARD_GRAD_OP", "3": "NO_SHARD", "4": "HYBRID_SHARD"}.get(name, name)
            if name == "FULL_SHARD":
                d.setting(f, self.line(ck(key)), ck(key), v, sets="every state sharded (as modelled)")
            elif name == "SHARD_GRAD_OP" and strategy == "fsdp1":
                d.setting(f, self.line(ck(key)) or self.line("fsdp"), key if key.startswith("fsdp:") else ck(key), v,
                          reshard_after_forward=False)
            elif name in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2", "HYBRID_SHARD_ZERO2") and strategy == "fsdp1":
                d.setting(f, self.line(ck(key)) or self.line("fsdp"), key if key.startswith("fsdp:") else ck(key), v,
                          hybrid_shard=True, **({"reshard_after_forward": False} if name.endswith("ZERO2") else {}))
            elif name in ("SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
                d.unmodelled_at(f, self.line(ck(key)) or self.line("fsdp"), key if key.startswith("fsdp:") else ck(key),
                               v, f"FSDP sharding strategy {name} is not modelled: estimated as FULL_SHARD")
            else:
                raise ConfigError(f, f"fsdp_config.{key} must be FULL_SHARD, SHARD_GRAD_OP, NO_SHARD or HYBRID_SHARD, "
                                     f"got {v!r}")
        if "state_dict_type" in plain:            # axolotl hands fsdp_config to accelerate's plugin (schemas/fsdp.py)
            key, v = plain["state_dict_type"]
            sharded = base.fsdp_sharded_save(f, ck(key), v)
            d.setting(f, self.line(ck(key)), ck(key), v, sharded_save=sharded)
        if "cpu_ram_efficient_loading" in plain:
            key, v = plain["cpu_ram_efficient_loading"]
            on = boolean(f, key, v)
            d.setting(f, self.line(ck(key)), ck(key), on, sets=loading.ram_efficient_words(on))
        if "use_orig_params" in plain:            # utils/trainer.py setup_fsdp_envs: FSDP_USE_ORIG_PARAMS when true
            key, v = plain["use_orig_params"]
            on = boolean(f, key, v)
            if strategy == "fsdp1":
                d.setting(f, self.line(ck(key)), ck(key), v, use_orig_params=on)
            else:
                d.ignored_at(f, self.line(ck(key)), ck(key), v)
        if "reshard_after_forward" in plain:
            key, v = plain["reshard_after_forward"]
            if boolean(f, key, v):
                d.setting(f, self.line(ck(key)), ck(key), v, sets="resharded after forward (as modelled)")
            else:
                d.setting(f, self.line(ck(key)), ck(key), v, reshard_after_forward=False)
        for name, (key, value) in plain.items():
            if name not in FSDP_KEYS:
                d.ignored_at(f, self.line(ck(key)), ck(key), value)
        return strategy

    def world_size(self):
        """gpus from dp_shard_size x dp_replicate_size x context_parallel_size x tensor_parallel_size when the file
        gives dp_shard_size (axolotl's ND-parallel keys, schemas/config.py); else the launcher decides (not here)."""
        d, f = self.d, self.path
        if not self.has("dp_shard_size"):
            return
        shard = positive_int(f, "dp_shard_size", self.take("dp_shard_size"))
        replicate = positive_int(f, "dp_replicate_size", self.take("dp_replicate_size", 1))
        others = 1
        for key in ("context_parallel_size", "sequence_parallel_degree", "tensor_parallel_size"):
            if self.has(key):
                others *= positive_int(f, key, self.data[key])
        world = shard * replicate * others
        d.setting(f, self.line("dp_shard_size"), "dp_shard_size", shard, gpus=world,
                  sets=f"gpus={world} (dp_shard_size x dp_replicate_size x context/tensor parallel sizes)")
        self.replicate = replicate

    def replicas(self, strategy: str) -> None:
        """dp_replicate_size (read by world_size, given with dp_shard_size) once the strategy is known: HSDP under
        FSDP2 (accelerate's ParallelismConfig: dp_replicate x dp_shard mesh)."""
        d, f, replicate = self.d, self.path, getattr(self, "replicate", 1)
        if replicate > 1 and strategy == "fsdp2":
            d.setting(f, self.line("dp_replicate_size"), "dp_replicate_size", replicate, dp_replicate=replicate,
                      sets=f"dp_replicate={replicate} (HSDP: {replicate} groups, each sharding over dp_shard_size "
                           f"x context_parallel_size GPUs)")
        elif replicate > 1:
            d.unmodelled_at(f, self.line("dp_replicate_size"), "dp_replicate_size", replicate,
                           "replicas without FSDP2 (accelerate's ParallelismConfig builds HSDP for FSDP2 only) are "
                           "not modelled: estimated as sharding over all GPUs")

    def checkpointing(self):
        d, f = self.d, self.path
        if not self.has("gradient_checkpointing"):
            self.used.add("gradient_checkpointing")
            if d.fields.get("checkpointing") != "full":
                d.default(TOOL, "gradient_checkpointing", False, SRC.format(file="config.py"),
                          checkpointing="none")
        else:
            v = self.take("gradient_checkpointing")
            if v is True:
                d.setting(f, self.line("gradient_checkpointing"), "gradient_checkpointing", v, checkpointing="full")
            elif v is False:
                d.setting(f, self.line("gradient_checkpointing"), "gradient_checkpointing", v,
                          **({} if d.fields.get("checkpointing") == "full" else {"checkpointing": "none"}))
            elif v == "unsloth":
                raise ConfigError(f, "gradient_checkpointing 'unsloth' was axolotl v0.6's; the 0.18 schema takes true, "
                                     "false, offload or offload_disk (schemas/config.py) and refuses it: offload is "
                                     "its successor")
            elif v in ("offload", "offload_disk"):
                d.setting(f, self.line("gradient_checkpointing"), "gradient_checkpointing", v, checkpointing="full")
                d.unmodelled_at(f, self.line("gradient_checkpointing"), "gradient_checkpointing", v,
                               "the checkpointed layer inputs are offloaded to the CPU" + (" (to disk)" if v ==
                               "offload_disk" else "") + ": not modelled, estimated as full checkpointing on the GPU "
                               "(an upper bound)")
            else:
                raise ConfigError(f, f"gradient_checkpointing must be true, false, offload or offload_disk, "
                                     f"got {v!r}")
        for key in ("activation_offloading", "layer_offloading", "selective_checkpointing"):
            if self.has(key) and self.data[key]:
                d.unmodelled_at(f, self.line(key), key, self.take(key), f"axolotl's {key.replace('_', ' ')} is not "
                                                                       f"modelled")
            elif key in self.data:
                self.used.add(key)

    def attention(self):
        d, f = self.d, self.path
        impl = self.take("attn_implementation")
        if impl is not None and not isinstance(impl, str):
            raise ConfigError(f, f"attn_implementation must be a name such as flash_attention_2 or sdpa, got {impl!r}")
        if impl is not None:
            allowed = hf_names.attention_known(impl)
            if allowed:
                raise ConfigError(f, f"attn_implementation {impl!r} is none transformers takes ({', '.join(allowed)}, "
                                     f"or a hub kernel org/name): it stops loading the model"
                                  + did_you_mean(impl, allowed))
            if impl not in ATTENTION:
                d.unmodelled_at(f, self.line("attn_implementation"), "attn_implementation", impl,
                               f"attention {impl!r} is not modelled: estimated as sdpa")
                d.fields["attention"] = "sdpa"
            else:
                d.setting(f, self.line("attn_implementation"), "attn_implementation", impl, attention=ATTENTION[impl])
            return
        for key, value in (("flash_attention", "flash"), ("sdp_attention", "sdpa"), ("eager_attention", "eager")):
            if self.has(key) and self.data[key]:
                d.setting(f, self.line(key), key, self.take(key), attention=value)
                return
            if key in self.data:
                self.used.add(key)
        for key in ("xformers_attention", "flex_attention", "sage_attention"):
            if self.has(key) and self.data[key]:
                d.unmodelled_at(f, self.line(key), key, self.take(key), f"{key} is not modelled: estimated as sdpa")
                d.fields["attention"] = "sdpa"
                return
        d.default("transformers (from_pretrained)", "attn_implementation", "sdpa", "transformers picks sdpa when "
                  "neither axolotl key names an attention (PreTrainedModel._check_and_adjust_attn_implementation)",
                  attention="sdpa")

    def lora(self, strategy: str):
        d, f = self.d, self.path
        adapter = self.take("adapter")
        four, eight = (bool(boolean(self.path, k, self.take(k))) if self.data.get(k) is not None else False
                       for k in ("load_in_4bit", "load_in_8bit"))
        if adapter in (None, ""):
            for key in ("lora_r", "lora_target_modules", "lora_target_linear", "lora_alpha", "lora_dropout"):
                if key in self.data:
                    self.take(key)
                    d.ignored_at(f, self.line(key), key, self.data[key])
            if four or eight:
                d.unmodelled_at(f, self.line("load_in_4bit" if four else "load_in_8bit"),
                               "load_in_4bit" if four else "load_in_8bit", True, "a quantised base without an adapter "
                               "is not trained by axolotl; not modelled")
            return
        if adapter not in ("lora", "qlora", "llama-adapter") and not self.data.get("plugins"):
            raise ConfigError(f, f"adapter {adapter!r} is none of axolotl's (lora, qlora, llama-adapter; others come "
                                 f"from plugins, and this file loads none: loaders/adapter.py load_adapter)"
                                 + did_you_mean(adapter, ["lora", "qlora", "llama-adapter"], 0.5))
        if adapter not in ("lora", "qlora"):
            d.unmodelled_at(f, self.line("adapter"), "adapter", adapter, f"adapter {adapter!r} is not modelled: "
                                                                        f"estimated as full fine-tuning")
            return
        if adapter == "qlora" and not self.data.get("merge_lora"):   # schemas/peft.py validate_qlora (training)
            if eight:
                raise ConfigError(f, "adapter qlora with load_in_8bit: axolotl refuses it ('Can't load qlora in "
                                     "8bit', schemas/peft.py); QLoRA loads the base in 4-bit: load_in_4bit: true")
            if not four:
                raise ConfigError(f, "adapter qlora without load_in_4bit: true: axolotl refuses it ('Require "
                                     "cfg.load_in_4bit to be True for qlora', schemas/peft.py)")
        rank = positive_int(f, "lora_r", self.take("lora_r"))
        d.setting(f, self.line("adapter"), "adapter", adapter, sets="LoRA adapters on a frozen base")
        d.setting(f, self.line("lora_r"), "lora_r", rank, lora_rank=rank)
        dropout = self.take("lora_dropout")
        if dropout is None:                  # schemas/peft.py validate_lora_dropout: None -> 0.0 with an adapter
            d.default(TOOL, "lora_dropout", 0.0, SRC.format(file="peft.py"), lora_dropout=0.0)
        else:
            d.setting(f, self.line("lora_dropout"), "lora_dropout", dropout,
                      lora_dropout=probability(f, "lora_dropout", dropout))
        targets = self.take("lora_target_modules")
        linear = self.take("lora_target_linear")
        if linear is not None and boolean(f, "lora_target_linear", linear):
            d.setting(f, self.line("lora_target_linear"), "lora_target_linear", True,
                      "every linear module's name but the output head, handed to peft as a list "
                      "(loaders/adapter.py find_all_linear_names): lora_targets=all-linear-names",
                      lora_targets=LINEAR_NAMES)
            if targets:
                d.setting(f, self.line("lora_target_modules"), "lora_target_modules", targets,
                          "added to that list by axolotl; a name that is no linear layer of the model (the output "
                          "head, an embedding) is not modelled")
        elif isinstance(targets, str) and targets != "all-linear":   # handed to peft as the string (adapter.py)
            joined = peft_regex(f, "lora_target_modules", targets, self.catalogue_model)
            d.setting(f, self.line("lora_target_modules"), "lora_target_modules", targets,
                      f"lora_targets={joined} (a regular expression to peft; in every layer)", lora_targets=joined)
        elif targets:
            names = targets if isinstance(targets, list) else [targets]
            if not all(isinstance(n, str) and n.isidentifier() for n in names):
                d.unmodelled_at(f, self.line("lora_target_modules"), "lora_target_modules", targets,
                               "regular-expression targets are not modelled: estimated on every linear layer")
                d.fields["lora_targets"] = "all-linear"
            else:
                d.setting(f, self.line("lora_target_modules"), "lora_target_modules", targets,
                          lora_targets=peft_names(f, "lora_target_modules", ",".join(names)))
        elif self.data.get("lora_target_parameters"):
            d.fields["lora_targets"] = "all-linear"
        else:
            raise ConfigError(f, "adapter lora needs lora_target_modules, lora_target_linear: true or "
                                 "lora_target_parameters (axolotl hands PEFT an empty target list otherwise)")
        params = self.take("lora_target_parameters")
        if params:
            d.unmodelled_at(f, self.line("lora_target_parameters"), "lora_target_parameters", params,
                            "LoRA on named parameters (peft's target_parameters, ParamWrapper: an MoE's 3-D experts) "
                            "is not modelled by name: estimated as all-linear, which adapts the experts too where "
                            "peft converts them")
        if four and adapter == "qlora":
            self.four_bit(self.take("bnb_config_kwargs"))
        elif four:
            d.setting(f, self.line("load_in_4bit"), "load_in_4bit", True,
                      "no 4-bit base: axolotl builds its BitsAndBytesConfig only for adapter qlora "
                      "(loaders/model.py); with adapter lora the base loads in the compute dtype")
        if eight:
            d.unmodelled_at(f, self.line("load_in_8bit"), "load_in_8bit", True, "a bitsandbytes 8-bit base is not "
                                                                              "modelled: estimated with a bf16 base")

    def four_bit(self, kwargs):
        """adapter qlora with load_in_4bit: axolotl's BitsAndBytesConfig (loaders/model.py: nf4 with double
        quantisation), updated by `bnb_config_kwargs`."""
        d, f = self.d, self.path
        double, line = True, self.line("load_in_4bit")
        if kwargs is not None:
            if not isinstance(kwargs, dict):
                raise ConfigError(f, f"bnb_config_kwargs must be a mapping of BitsAndBytesConfig arguments, got "
                                     f"{kwargs!r}")
            for key, value in kwargs.items():
                if key == "bnb_4bit_use_double_quant" and isinstance(value, bool):
                    double = value
                elif key == "bnb_4bit_use_double_quant":
                    raise ConfigError(f, f"bnb_config_kwargs.bnb_4bit_use_double_quant must be true or false, got "
                                         f"{value!r}")
                elif key == "bnb_4bit_quant_type" and value != "nf4":
                    d.unmodelled_at(f, self.line("bnb_config_kwargs"), f"bnb_config_kwargs.{key}", value,
                                    f"4-bit {value} base weights are not modelled: estimated as nf4")
                elif key not in ("bnb_4bit_quant_type", "bnb_4bit_compute_dtype", "bnb_4bit_quant_storage"):
                    d.unmodelled_at(f, self.line("bnb_config_kwargs"), f"bnb_config_kwargs.{key}", value,
                                    "not modelled: estimated with axolotl's BitsAndBytesConfig for it")
        weights = "nf4-dq" if double else "nf4"
        d.setting(f, line, "load_in_4bit", True, f"base_weights={weights} (axolotl's BitsAndBytesConfig: nf4, "
                                                 f"double quantisation {'on' if double else 'off'}; loaders/model.py)",
                  base_weights=weights)

    def optimizer(self, strategy: str):
        d, f = self.d, self.path
        name = self.take("optimizer")
        key_given = name is not None
        if key_given and not isinstance(name, str):
            raise ConfigError(f, f"optimizer must be an optimizer name such as adamw_torch_fused, got {name!r}")
        name = name or "adamw_torch_fused"
        from transformers.training_args import OptimizerNames

        names = [o.value for o in OptimizerNames] + list(CUSTOM_OPTIMIZERS)
        if name not in names:                # axolotl's own, else TrainingArguments' optim (OptimizerNames) refuses it
            raise ConfigError(f, f"optimizer {name!r} is neither one of axolotl's own optimizers nor one of "
                                 f"transformers' (TrainingArguments refuses it: OptimizerNames)"
                              + did_you_mean(name, names))
        changes, sets, notes = collect.optimizer_effect(d, name, strategies.get(strategy))
        for why in notes:
            d.unmodelled_at(f, self.line("optimizer"), "optimizer", name, why)
        if changes is None:
            return
        (d.setting(f, self.line("optimizer"), "optimizer", name, sets=sets, **changes) if key_given else
         d.default(TOOL, "optimizer", name, SRC.format(file="training.py"), sets=sets, **changes))

    def plugins(self):
        d, f = self.d, self.path
        plugins = self.take("plugins") or []
        if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
            raise ConfigError(f, f"plugins must be a list of plugin class paths, got {plugins!r}")
        if plugins:
            d.setting(f, self.line("plugins"), "plugins", plugins, sets="see the plugins' keys")
        liger, cce = LIGER in plugins, CCE in plugins
        for key in ("liger_rope", "liger_rms_norm", "liger_glu_activation", "liger_swiglu", "liger_layer_norm",
                    "liger_cross_entropy", "liger_fused_linear_cross_entropy", "cut_cross_entropy"):
            if key not in self.data:
                continue
            value = self.take(key)
            active = (liger if key.startswith("liger") else cce) and bool(value)
            if not active:
                d.ignored_at(f, self.line(key), key, value)
            elif key in ("liger_fused_linear_cross_entropy", "cut_cross_entropy") and self.data.get("reward_model"):
                d.unmodelled_at(f, self.line(key), key, value, "a reward model has no LM head: no fused "
                                                              "cross-entropy runs, so it changes nothing here")
            elif key in ("liger_fused_linear_cross_entropy", "cut_cross_entropy"):
                d.setting(f, self.line(key), key, value, fused_ce=True)
            else:
                d.unmodelled_at(f, self.line(key), key, value, "Liger's kernel saves other activations than the "
                                                              "eager modules: not modelled")
        if cce and "cut_cross_entropy" not in self.data and not self.data.get("reward_model"):
            d.default(TOOL, "cut_cross_entropy", True, "github:axolotl-ai-cloud/axolotl src/axolotl/integrations/"
                      "cut_cross_entropy/args.py @067b021c", fused_ce=True)
        for p in plugins:
            if p not in (LIGER, CCE):
                d.unmodelled_at(f, self.line("plugins"), "plugins", p, "this plugin's memory effect is not modelled")

    def rl(self):
        d, f = self.d, self.path
        rl = self.take("rl")
        if rl is None:
            return
        if rl not in RL_TYPES:
            raise ConfigError(f, f"rl must be one of axolotl's RL trainers ({', '.join(RL_TYPES)}), got {rl!r} (its "
                                 f"schema refuses anything else: schemas/enums.py RLType)" + did_you_mean(rl, RL_TYPES))
        if rl in ("dpo", "ipo"):
            d.setting(f, self.line("rl"), "rl", rl, run="dpo",
                      sets="run=dpo (TRL's DPOTrainer: chosen and rejected of each pair in one forward, a frozen "
                           "reference model unless LoRA's base with the adapters disabled serves; TRL's log-probs)")
        elif rl == "kto":
            d.setting(f, self.line("rl"), "rl", rl, run="kto",
                      sets="run=kto (TRL's KTOTrainer, core/trainers/trl.py AxolotlKTOTrainer: each example's one "
                           "completion, the KL batch through the policy and the reference under no_grad, a frozen "
                           "reference model unless LoRA's base with the adapters disabled serves; TRL's log-probs)")
        elif rl == "grpo":
            self.grpo()
        else:
            d.unmodelled_at(f, self.line("rl"), "rl", rl, f"rl {rl!r} (its extra models and sequences) is not "
                                                        f"modelled: estimated as supervised fine-tuning")

    def grpo(self):
        """axolotl's GRPO (core/trainers/grpo/__init__.py set_training_args_kwargs @067b021c, over TRL 1.8's
        GRPOTrainer): the `trl:` block's max_completion_length (passed even when unset: None, no cap), beta (or
        rl_beta), use_vllm and vllm_mode (server when unset: schemas/validation.py check_vllm_mode_set); with
        colocate, vLLM's share and sleep mode from the `vllm:` block's gpu_memory_utilization (0.9 by default,
        schemas/vllm.py) and trl.vllm_enable_sleep_mode. max_prompt_length and max_length are
        blocked (get_blocklist_args_kwargs): prompts stay whole, sequence_len does not bound the sequence."""
        d, f = self.d, self.path
        trl, vllm = self.take("trl") or {}, self.take("vllm") or {}
        for name, block in (("trl", trl), ("vllm", vllm)):
            if not isinstance(block, dict):
                raise ConfigError(f, f"{name} must be a mapping of {name} options, got {block!r}")
        at = self.line("trl") or self.line("rl")
        d.setting(f, self.line("rl"), "rl", "grpo", run="grpo",
                  sets="run=grpo (axolotl's GRPO trainer over TRL's GRPOTrainer: completions generated between steps, "
                       "trained on their log-probabilities)")
        comp = trl.get("max_completion_length")
        if comp is None:
            comp = COMPLETION_DEFAULT
            d.unmodelled_at(f, at, "trl.max_completion_length", None,
                            f"unset: axolotl passes None to GRPOConfig, so completions run to the model's context "
                            f"length; estimated at {comp} tokens (TRL's default), the real figure higher with longer "
                            f"ones")
        else:
            comp = positive_int(f, "trl.max_completion_length", comp)
        prompt = PROMPT_ASSUMED
        d.unmodelled_at(f, at, "(prompt length)", prompt,
                        f"axolotl blocks max_prompt_length for GRPO (prompts kept whole): estimated with {prompt} "
                        f"prompt tokens, longer prompts make the real figure higher")
        d.setting(f, at, "trl.max_completion_length", comp, completion=comp, seq=prompt + comp,
                  sets=f"completion={comp}, seq={prompt + comp} ({prompt} prompt tokens + the completion)")
        if self.has("sequence_len"):
            d.unmodelled_at(f, self.line("sequence_len"), "sequence_len", self.data["sequence_len"],
                            "not a GRPO sequence's bound (axolotl blocks max_length for GRPO): the sequence is "
                            "prompt + completion, as above")
        beta = trl.get("beta") if trl.get("beta") is not None else self.take("rl_beta")   # (builders/rl.py's order)
        if beta is not None and (isinstance(beta, bool) or not isinstance(beta, (int, float))):
            raise ConfigError(f, f"trl.beta must be a number, got {beta!r}")
        lora = self.data.get("adapter") in ("lora", "qlora")
        if beta:
            ref = "adapters-off" if lora else "copy"
            d.setting(f, at, "trl.beta", beta, reference=ref,
                      sets=f"reference={ref} (a KL term against the reference: "
                           + ("the base with the adapters disabled)" if lora else "a frozen copy of the model)"))
        else:
            d.default(TOOL, "trl.beta", 0.0, "TRL grpo_config.py GRPOConfig", "no reference model (beta 0.0)")
        use = trl.get("use_vllm")
        mode = trl.get("vllm_mode")
        if use and mode is None:          # schemas/validation.py check_vllm_mode_set: unset means server
            d.default(TOOL, "trl.vllm_mode", "server", SRC.format(file="validation.py check_vllm_mode_set"),
                      "generation=vllm-server (axolotl sets vllm_mode server when use_vllm leaves it unset: "
                      "`axolotl vllm-serve` on GPUs of its own)", generation="vllm-server")
        elif use and mode == "server":
            d.setting(f, at, "trl.use_vllm", True, generation="vllm-server", sets="generation=vllm-server")
        elif use:
            share = vllm.get("gpu_memory_utilization", 0.9)
            sleep = bool(trl.get("vllm_enable_sleep_mode"))
            if not isinstance(share, (int, float)) or isinstance(share, bool) or not 0 < share <= 1:
                raise ConfigError(f, f"vllm.gpu_memory_utilization must be a fraction in (0, 1], got {share!r}")
            why = "vllm.gpu_memory_utilization (axolotl passes it with vllm_mode colocate; 0.9 by default)"
            d.setting(f, at, "trl.use_vllm", True, generation="vllm-colocate", vllm_share=float(share),
                      vllm_sleep=sleep, sets=f"generation=vllm-colocate, vllm_share={share:g} from {why}, "
                                             f"vllm_sleep={sleep}")
        else:
            d.default(TOOL, "trl.use_vllm", False, SRC.format(file="trl.py"),
                      "generation=generate (transformers' generate in each process)")
        if trl.get("sync_ref_model") and beta and not lora:
            d.setting(f, at, "trl.sync_ref_model", True, sync_ref=True,
                      sets="sync_ref: the reference mixed with the policy after a step")
        for key in ("generation_batch_size", "use_liger_loss", "vllm_lora_sync", "async_prefetch", "use_data_producer"):
            if trl.get(key):
                d.unmodelled_at(f, at, f"trl.{key}", trl[key], "not modelled: generation's batch and engine are "
                                                               "estimated as TRL's defaults")

    def extras(self):
        """Keys of axolotl's schema (schemas/config.py and peft.py @067b021c) that change memory and are not modelled:
        listed with the direction of the real figure, never left under "ignored"."""
        d, f = self.d, self.path
        for key, why in EXTRAS:
            value = self.take(key)
            if value is None or value is False or value == []:
                continue
            if key in ("model_type", "num_labels"):
                if not _sequence_classifier(self.data):
                    self.used.discard(key)                                    # a causal LM's class: ignored as before
                elif self.data.get("reward_model"):
                    if key == "num_labels" and value != 1:
                        raise ConfigError(f, f"num_labels {value!r} with reward_model: TRL's RewardTrainer refuses a "
                                             f"model whose num_labels is not 1 (one score per sequence); set "
                                             f"num_labels: 1")
                    d.setting(f, self.line(key), key, value, sets="the reward model's score head (run=rm)")
                elif self.data.get("process_reward_model"):
                    d.setting(f, self.line(key), key, value, sets="the reward model's head (listed as not modelled)")
                else:
                    d.unmodelled_at(f, self.line(key), key, value, why)
                continue
            if key == "unfrozen_parameters" and d.fields.get("lora_rank") is not None:
                why = ("parameters these patterns match are trained beside the adapter (their gradients and optimizer "
                       "states): not modelled, the real figure is higher")
            if key == "reward_model":
                d.setting(f, self.line(key), key, value, run="rm",
                          sets="run=rm (TRL's RewardTrainer: AutoModelForSequenceClassification with one label, each "
                               "pair's chosen and rejected in one forward, the micro batch counting pairs)")
                continue
            d.unmodelled_at(f, self.line(key), key, value, why)

    def apply_deepspeed(self, ref, model: str | None):
        d, f = self.d, self.path
        if not isinstance(ref, (str, dict)):
            raise ConfigError(f, f"deepspeed must be the path of a DeepSpeed JSON or the config itself, got {ref!r}")
        trainer = {"per_device_train_batch_size": (self.micro, self.at("micro_batch_size")),
                   "gradient_accumulation_steps": (d.fields.get("grad_accum", 1),
                                                   self.at("gradient_accumulation_steps")),
                   "bf16": self.trainer_bf16, "fp16": self.trainer_fp16}
        hidden = model_ref.hidden_size(model)
        ds_path, applied = _deepspeed(f, ref, self.given, trainer, hidden, self.lines)
        d.files.append(str(ds_path))
        d.setting(f, self.line("deepspeed"), "deepspeed", ref if isinstance(ref, str) else "(inline)",
                  sets=f"the DeepSpeed config {ds_path if isinstance(ref, str) else 'inline in ' + f.name}")
        changes = dict(applied.fields)
        if changes.get("strategy", "ddp") in ("zero1", "zero2", "zero3"):
            d.fields.pop("adam_impl", None)                                   # DeepSpeed brings its own Adam
        if d.fields.get("strategy") in ("fsdp1", "fsdp2") and "strategy" in changes:
            raise ConfigError(f, "both deepspeed and fsdp are set: axolotl runs one of them")
        applied.fields = changes
        d.merge(applied)
        if "gpus" not in d.fields:
            d.gpus_unknown()


def read(path: Path, data, lines: dict, given: list[Path]) -> Imported:
    """The set-up an axolotl YAML describes, with its DeepSpeed companion when it names one."""
    if not isinstance(data, dict):
        raise ConfigError(path, f"an axolotl config must be a YAML mapping, got {type(data).__name__}")
    return _Reader(path, data, lines, given).read()

