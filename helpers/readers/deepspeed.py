"""Reader of a DeepSpeed JSON config, alone or as the companion of a trainer's config (LLaMA-Factory, TRL, axolotl,
accelerate): `read()` for the file alone, `apply()` for the other readers to lay a DeepSpeed config over what they read.

Sources (read for this module):
- DeepSpeed 0.19.8 (installed): `runtime/zero/config.py` (stage 0 default, reduce_bucket_size 5e8, sub_group_size
  1e9, stage3_prefetch_bucket_size 5e7, overlap_comm None -> True for stage 3 only), `runtime/zero/offload_config.py`
  (pin_memory default True for offload_param and offload_optimizer, ratio default 1.0).
- transformers 5.x (installed), `integrations/deepspeed.py`, `HfTrainerDeepSpeedConfig.trainer_config_process`: an
  "auto" train_micro_batch_size_per_gpu <- per_device_train_batch_size, gradient_accumulation_steps <- the same,
  train_batch_size <- world_size x micro batch x accumulation, bf16.enabled <- args.bf16, fp16.enabled <- args.fp16;
  a number that differs from the TrainingArguments value is a mismatch the Trainer refuses (ValueError);
  `trainer_config_finalize`: reduce_bucket_size <- hidden_size^2, and for ZeRO-3 stage3_prefetch_bucket_size <-
  int(0.9 x hidden_size^2), stage3_param_persistence_threshold <- 10 x hidden_size.
- transformers `TrainingArguments` defaults (per_device_train_batch_size 8, gradient_accumulation_steps 1, bf16 False,
  fp16 False): what "auto" becomes when the DeepSpeed file is given alone.
"""

from __future__ import annotations

import enum
import math
from pathlib import Path
from typing import Any

from helpers.readers.base import ConfigError, Default, Ignored, Imported, NotModelled
from helpers.readers.provenance import Record, boolean

NAME = "deepspeed"

DS_VERSION = "DeepSpeed 0.19.8"
DS_SOURCE = "deepspeed/runtime/zero/config.py, offload_config.py (DeepSpeed 0.19.8)"
HF_SOURCE = "transformers/integrations/deepspeed.py, HfTrainerDeepSpeedConfig.trainer_config_process/_finalize"
STAGES = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}

# Keys that change memory but that the estimate does not model: listed with their value, never dropped.
NOT_MODELLED = {
    "torch_autocast": "DeepSpeed's torch.autocast over the forward (its own mixed precision): not modelled, the "
                      "activations are estimated at the precision the other sections give",
    "amp": "NVIDIA apex AMP: not modelled, estimated at the precision the other sections give",
    "zero_optimization.stage3_param_persistence_threshold":
        "ZeRO-3 keeps parameters smaller than this gathered on every GPU (small: norms and biases)",
    "zero_optimization.stage3_max_live_parameters": "ZeRO-3 cap on gathered parameters alive at once",
    "zero_optimization.stage3_max_reuse_distance": "ZeRO-3 keeps a gathered parameter reused within this distance",
    "zero_optimization.allgather_bucket_size": "ZeRO-1/2 all-gather bucket (elements)",
    "zero_optimization.contiguous_gradients": "a contiguous buffer gradients are copied into as they are produced",
    "zero_optimization.offload_optimizer.buffer_count": "number of pinned buffers for NVMe offload",
    "zero_optimization.offload_param.buffer_count": "number of pinned buffers for NVMe offload",
    "zero_optimization.offload_param.buffer_size": "size of the pinned buffers for NVMe offload",
    "zero_optimization.offload_param.max_in_cpu": "parameters kept in CPU memory under NVMe offload",
    "zero_optimization.zero_hpz_partition_size": "ZeRO++ hierarchical partitioning keeps a secondary copy",
    "zero_optimization.zero_quantized_weights": "ZeRO++ quantised weight all-gather",
    "zero_optimization.zero_quantized_gradients": "ZeRO++ quantised gradient reduce",
    "zero_optimization.round_robin_gradients": "stage 1/2 gradient partition order",
    "communication_data_type": "dtype of the reduced gradients",
    "data_types.grad_accum_dtype": "dtype of the accumulated gradients",
    "tensor_parallel": "DeepSpeed AutoTP tensor parallelism",
    "pipeline": "pipeline parallelism",
    "sequence_parallel_size": "Ulysses sequence parallelism",
    "compression_training": "DeepSpeed compression",
    "flops_profiler": "profiler buffers",
    "zero_optimization.zenflow": "ZenFlow keeps the most important gradients' updates on the GPU and defers the rest "
                                 "to the CPU optimizer",
    "zero_optimization.offload_optimizer.super_offload": "SuperOffload (GPU-CPU hybrid optimizer step)",
}
# Keys read below (whole sub-trees for those ending in '.').
READ = {"zero_optimization.stage", "zero_optimization.offload_optimizer.device",
        "zero_optimization.offload_optimizer.pin_memory", "zero_optimization.offload_optimizer.ratio",
        "zero_optimization.offload_param.device", "zero_optimization.offload_param.pin_memory",
        "zero_optimization.reduce_bucket_size", "zero_optimization.sub_group_size",
        "zero_optimization.stage3_prefetch_bucket_size", "zero_optimization.overlap_comm", "bf16.enabled",
        "fp16.enabled", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size",
        "activation_checkpointing", "optimizer.type", "optimizer.params.torch_adam", "bfloat16.enabled",
        *(f"zero_optimization.{k}" for k in ("stage3_gather_16bit_weights_on_model_save",
                                              "gather_16bit_weights_on_model_save",
                                              "stage3_gather_fp16_weights_on_model_save"))}
CONTAINERS = {"zero_optimization", "zero_optimization.offload_optimizer", "zero_optimization.offload_param", "bf16",
              "fp16", "bfloat16", "optimizer"}


def transformers_tool() -> str:
    """'transformers X.Y.Z', the installed version whose TrainingArguments defaults and DeepSpeed rules apply."""
    import importlib.metadata

    return f"transformers {importlib.metadata.version('transformers')}"


# TrainingArguments fields an "auto" takes its value from, and their defaults (transformers training_args.py).
HF_DEFAULTS = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "bf16": False, "fp16": False}


def claims(path: Path, data) -> bool:
    """A JSON object with DeepSpeed's own top-level keys."""
    keys = {"zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size", "zero_allow_untested_optimizer",
            "fp16", "bf16"}
    return Path(path).suffix.lower() == ".json" and isinstance(data, dict) and bool(keys & set(data))


def read(path: Path, data, lines: dict[str, int], given: list[Path]) -> Imported:
    """A DeepSpeed JSON alone: no model (the CLI asks for --model, and the model given beside it sizes the "auto"
    buckets), "auto" values from TrainingArguments' defaults, the world size from train_batch_size when that is a
    number, else gpus=1 as a default."""
    from helpers.readers import model_ref

    return apply(path, data, lines, hidden=model_ref.hidden_size(None)).finish(None, None)


# The keys DeepSpeed 0.19.8's pydantic config models accept (field names and aliases; DeepSpeedConfigModel has
# extra="forbid", runtime/config_utils.py, so any other key is a validation error when the engine starts):
# runtime/zero/config.py DeepSpeedZeroConfig, runtime/zero/offload_config.py DeepSpeedZeroOffload{Optimizer,Param}Config.
ZERO_KEYS = frozenset((
    "allgather_bucket_size", "allgather_partitions", "allgather_sequential", "compute_grad_norm", "contiguous_gradients",
    "cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory", "elastic_checkpoint", "enable_sanity_checks",
    "gather_16bit_weights_on_model_save", "ignore_unused_parameters", "leaf_module", "legacy_stage1",
    "load_from_fp32_weights", "log_trace_cache_warnings", "max_live_parameters", "max_reuse_distance",
    "memory_efficient_linear", "model_persistence_threshold", "module_granularity_threshold", "offload_optimizer",
    "offload_param", "overlap_comm", "override_module_apply", "param_persistence_threshold", "parameter_alignment",
    "pipeline_loading_checkpoint", "prefetch_bucket_size", "reduce_bucket_size", "reduce_scatter",
    "round_robin_gradients", "save_muon_momentum_buffer_in_memory", "stage", "stage3_gather_fp16_weights_on_model_save",
    "sub_group_size", "use_all_reduce_for_fetch_params", "use_multi_rank_bucket_allreduce", "zenflow",
    "zero_hpz_partition_size", "zero_quantized_gradients", "zero_quantized_nontrainable_weights",
    "zero_quantized_weights", "stage3_allgather_sequential", "stage3_gather_16bit_weights_on_model_save",
    "stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_model_persistence_threshold",
    "stage3_module_granularity_threshold", "stage3_param_persistence_threshold", "stage3_prefetch_bucket_size",
    "stage3_use_all_reduce_for_fetch_params"))
OFFLOAD_OPTIMIZER_KEYS = frozenset(("buffer_count", "cpuadam_cores_perc", "device", "fast_init", "nvme_path",
                                    "pin_memory", "pipeline_read", "pipeline_write", "ratio", "super_offload"))
OFFLOAD_PARAM_KEYS = frozenset(("buffer_count", "buffer_size", "device", "max_in_cpu", "nvme_path", "pin_memory"))


def _refuse_unknown(path, where: str, section: dict, known: frozenset) -> None:
    """ConfigError for a key of `section` DeepSpeed's config model does not have, with the nearest one it does."""
    import difflib

    for key in section:
        if key not in known:
            near = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
            raise ConfigError(path, f"{where}.{key} is not a DeepSpeed setting" + (f": did you mean {where}.{near[0]}?"
                                    if near else "") + " (DeepSpeed's config model refuses unknown keys)")


def _models():
    """DeepSpeed's own pydantic config models of the sections read here (imported on first use: a second or two)."""
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    return {"zero_optimization": DeepSpeedZeroConfig, "bf16": DeepSpeedBF16Config, "bfloat16": DeepSpeedBF16Config,
            "fp16": DeepSpeedFP16Config}


def as_deepspeed_reads(path, data: dict) -> dict:
    """`data` with its zero_optimization, bf16 and fp16 sections validated by DeepSpeed's own config models (the
    installed release's; they drop "auto" values first, runtime/config_utils.py): a value DeepSpeed refuses (a
    negative stage3_max_live_parameters, contiguous_gradients "abc", an unknown key such as bf16.enable, partial
    offload below stage 3) is a ConfigError with DeepSpeed's reason; a value its lax parsing converts ("true",
    "0.5", "2") is taken as it takes it."""
    from pydantic import ValidationError

    out = dict(data)
    for section, model in _models().items():
        if section not in data:
            continue
        raw = data[section]
        if section == "zero_optimization" and isinstance(raw, bool):
            raw = {"stage": int(raw)}          # the legacy form: runtime/zero/config.py read_zero_config_deprecated
        if not isinstance(raw, dict):
            raise ConfigError(path, f"{section} must be an object, got {raw!r}")
        for name, f in model.model_fields.items():
            if f.alias and f.alias != name and name in raw and f.alias in raw:
                raise ConfigError(path, f"{section}.{name} and {section}.{f.alias} are one setting ({f.alias} is its "
                                        f"other name): DeepSpeed's config model refuses both; keep one")
        if section == "zero_optimization" and raw.get("stage", "auto") != "auto":
            _stage(path, "zero_optimization.stage", raw["stage"])
        try:
            checked = model(**raw)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join([section, *map(str, first["loc"])])
            if first["type"] == "extra_forbidden":
                import difflib

                names = _names(model, first["loc"])
                near = difflib.get_close_matches(str(first["loc"][-1]), names, n=1, cutoff=0.6)
                raise ConfigError(path, f"{where} is not a DeepSpeed setting" + (
                    f": did you mean {'.'.join([section, *map(str, first['loc'][:-1]), near[0]])}?" if near else "")
                    + " (DeepSpeed's config model refuses unknown keys)") from None
            got = first.get("input")
            raise ConfigError(path, f"{where}: DeepSpeed's config model refuses " + (f"{got!r}: " if first["loc"]
                                    else "it: ") + first["msg"]) from None
        out[section] = _coerced(raw, checked)
        if section == "zero_optimization":
            out[section] = _modern(out[section], model)
    return out


def _modern(raw: dict, model) -> dict:
    """zero_optimization as the reader reads it: each field given by its own name under the name the reader reads (its
    alias: prefetch_bucket_size is stage3_prefetch_bucket_size), and the deprecated cpu_offload / cpu_offload_param
    turned into what DeepSpeed turns them into (runtime/zero/config.py new_param_fn: offload_optimizer /
    offload_param on the CPU)."""
    out = dict(raw)
    for name, f in model.model_fields.items():
        if f.alias and f.alias != name and name in out:
            out[f.alias] = out.pop(name)
    for old, new in (("cpu_offload", "offload_optimizer"), ("cpu_offload_param", "offload_param")):
        if out.get(old) is True and new not in out:
            out.pop(old)
            out[new] = {"device": "cpu"}
    return out


def _names(model, loc) -> list[str]:
    """Field names and aliases of the (nested) model at `loc` (less its last part)."""
    for part in loc[:-1]:
        field = model.model_fields.get(part) or next((f for f in model.model_fields.values() if f.alias == part), None)
        annotation = getattr(field, "annotation", None)
        inner = [a for a in getattr(annotation, "__args__", (annotation,)) if hasattr(a, "model_fields")]
        if not inner:
            return []
        model = inner[0]
    return sorted({n for n in model.model_fields} | {f.alias for f in model.model_fields.values() if f.alias})


def _coerced(raw: dict, checked) -> dict:
    """`raw` with each text or number DeepSpeed converted replaced by what it converted it to ("auto" kept)."""
    fields = type(checked).model_fields
    out = dict(raw)
    for key, value in raw.items():
        name = key if key in fields else next((n for n, f in fields.items() if f.alias == key), None)
        if name in (None, "stage") or value == "auto" or not hasattr(checked, name):   # (a key DeepSpeed moved)
            continue
        got = getattr(checked, name)
        if isinstance(value, dict) and hasattr(got, "model_fields"):
            out[key] = _coerced(value, got)
        elif isinstance(value, (str, int, float)) and isinstance(got, (bool, int, float)) and \
                not isinstance(got, enum.Enum) and type(got) is not type(value):
            out[key] = got
    return out


def _number(path, key: str, value, integer: bool = True, positive: bool = True):
    """An int (DeepSpeed accepts 1e9 written as a float) or ConfigError naming the key."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(path, f"{key} must be a number or \"auto\", got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(path, f"{key} must be a finite number, got {value!r}")
    if integer:
        if value != int(value):
            raise ConfigError(path, f"{key} must be a whole number, got {value!r}")
        value = int(value)
    if positive and value <= 0:
        raise ConfigError(path, f"{key} must be positive, got {value!r}")
    return value


def apply(path: Path, data, lines: dict[str, int], trainer: dict[str, tuple[Any, str]] | None = None,
          hidden: int | None = None) -> Record:
    """Lay the DeepSpeed config `data` (read from `path`) over a trainer's values.

    trainer: TrainingArguments values the referring tool sets, name -> (value, where it came from, e.g.
    'run.yaml line 12' or 'LLaMA-Factory 0.9.6 default'): per_device_train_batch_size, gradient_accumulation_steps,
    bf16, fp16. None: the DeepSpeed file is read alone, and its "auto" values take TrainingArguments' defaults.
    hidden: the model's hidden size, for the "auto" bucket sizes (None: no model named; DeepSpeed's defaults stay
    and the "auto" is listed as not modelled).
    Raises ConfigError where a number differs from the trainer's value (the HF Trainer refuses that mismatch)."""
    return _Reader(path, data, lines, trainer, hidden).read()


class _Reader:
    """One DeepSpeed config laid over a trainer's values, a topic per method, into one provenance Record."""

    def __init__(self, path: Path, data, lines: dict[str, int], trainer, hidden):
        if not isinstance(data, dict):
            raise ConfigError(path, f"a DeepSpeed config must be a JSON object, got {type(data).__name__}")
        self.path, self.data, self.trainer, self.hidden = path, as_deepspeed_reads(path, data), trainer, hidden
        self.f = str(path)
        self.out = Record(NAME, path, lines)
        self.hf = transformers_tool()
        self.zero, self.stage = {}, 0

    def read(self) -> Record:
        for topic in (self.stage_, self.offload, self.buckets, self.precision, self.sizes, self.ds_checkpointing,
                      self.optimizer, self.saves, self.rest):
            topic()
        return self.out

    def setting(self, key, value, sets, **fields):
        """A value of the file: its Setting, and the fields it sets."""
        self.out.set(key, value, sets, **fields)

    def from_trainer(self, name: str, ds_key: str, render, fields=lambda v: {}) -> Any:
        """The trainer's value of `name` for an "auto" DeepSpeed key: recorded as a Setting of the DS file
        (`fields(value)`: the TrainSetup fields it sets)."""
        if self.trainer is not None and name in self.trainer:
            value, origin = self.trainer[name]
            self.setting(ds_key, "auto", f"{render(value)} (auto -> {name} = {value!r} from {origin}; {HF_SOURCE})",
                         **fields(value))
            return value
        value = HF_DEFAULTS[name]
        self.setting(ds_key, "auto", f"{render(value)} (auto -> {name}, TrainingArguments default; {HF_SOURCE})",
                     **fields(value))
        self.out.defaults.append(Default(self.hf, name, value, render(value),
                                         f"transformers/training_args.py TrainingArguments.{name} (the DeepSpeed "
                                         f"file's {ds_key} is \"auto\" and no trainer config was given)", fields(value)))
        return value

    def matches(self, name: str, ds_key: str, value):
        trainer = self.trainer
        if trainer is not None and name in trainer and trainer[name][0] != value:
            raise ConfigError(self.path, f"{ds_key} is {value!r} but {name} is {trainer[name][0]!r} "
                                         f"({trainer[name][1]}): the HF Trainer refuses that mismatch; set one of "
                                         f"them to \"auto\"")

    def stage_(self) -> None:
        """ZeRO stage -> strategy."""
        out, data, path, setting = self.out, self.data, self.path, self.setting
        zero = data.get("zero_optimization") or {}
        if not isinstance(zero, dict):
            raise ConfigError(path, f"zero_optimization must be an object, got {zero!r}")
        _refuse_unknown(path, "zero_optimization", zero, ZERO_KEYS)
        for section, keys in (("offload_optimizer", OFFLOAD_OPTIMIZER_KEYS), ("offload_param", OFFLOAD_PARAM_KEYS)):
            if isinstance(zero.get(section), dict):
                _refuse_unknown(path, f"zero_optimization.{section}", zero[section], keys)
        stage = zero.get("stage", 0)
        if stage == "auto":
            # DeepSpeedConfigModel drops every "auto" value before validation (runtime/config_utils.py), so the default
            # stage applies; transformers has no rule for the stage.
            setting("zero_optimization.stage", stage, f"strategy=ddp (auto: DeepSpeed drops \"auto\" values of its "
                                                      f"zero_optimization and takes its default, stage 0; {DS_SOURCE})",
                    strategy="ddp")
            stage = 0
        elif "stage" in zero:
            stage = _stage(path, "zero_optimization.stage", stage)
            setting("zero_optimization.stage", zero["stage"], f"strategy={STAGES[stage]}", strategy=STAGES[stage])
        else:
            out.defaults.append(Default(DS_VERSION, "zero_optimization.stage", 0, "strategy=ddp", DS_SOURCE,
                                        {"strategy": "ddp"}))
        out.fields["strategy"] = STAGES[stage]
        self.zero, self.stage = zero, stage

    def offload(self) -> None:
        """Offload."""
        out, f, line = self.out, self.f, self.out.lines.get
        path, setting, zero, stage = self.path, self.setting, self.zero, self.stage
        pins = []
        for section, flag in (("offload_optimizer", "offload_optimizer"), ("offload_param", "offload_params")):
            sub = zero.get(section)
            if sub is None:
                continue
            key = f"zero_optimization.{section}"
            if not isinstance(sub, dict):
                raise ConfigError(path, f"{key} must be an object, got {sub!r}")
            device = sub.get("device", "none")
            if device == "auto":                 # dropped by DeepSpeedConfigModel: the default, "none"
                out.not_modelled.append(NotModelled(f, line(f"{key}.device"), f"{key}.device", device,
                                                    "auto: DeepSpeed drops it and takes its default, none (no offload)"))
                device = "none"
            if not isinstance(device, (str, type(None))) or device not in ("none", "cpu", "nvme", None):
                raise ConfigError(path, f"{key}.device must be none, cpu or nvme, got {device!r}")
            if device == "nvme":
                out.not_modelled.append(NotModelled(f, line(f"{key}.device"), f"{key}.device", device,
                                                    "NVMe offload is not modelled (host memory would hold only buffers)"))
                continue
            if section == "offload_param" and stage != 3:
                out.ignored.append(Ignored(f, line(f"{key}.device"), f"{key}.device", device))
                continue
            on = device == "cpu"
            setting(f"{key}.device", device, f"{flag}={on}", **{flag: on})
            if on:
                if "pin_memory" in sub and sub["pin_memory"] != "auto":
                    if not isinstance(sub["pin_memory"], bool):
                        raise ConfigError(path, f"{key}.pin_memory must be true or false, got {sub['pin_memory']!r}")
                    pins.append((f"{key}.pin_memory", sub["pin_memory"]))
                else:
                    out.defaults.append(Default(DS_VERSION, f"{key}.pin_memory", True, "pin_memory=True", DS_SOURCE,
                                                {"pin_memory": True}))
                    pins.append((None, True))
                if section == "offload_optimizer" and "ratio" in sub and sub["ratio"] != "auto":
                    ratio = sub["ratio"]
                    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
                        # NaN fails the comparison too; DeepSpeed's offload_config.py: ratio: float = Field(1.0, ge=0, le=1)
                        raise ConfigError(path, f"{key}.ratio must be a number in [0, 1], got {ratio!r}")
                    if stage == 3:
                        setting(f"{key}.ratio", ratio, f"offload_ratio={ratio}", offload_ratio=float(ratio))
                    else:
                        out.ignored.append(Ignored(f, line(f"{key}.ratio"), f"{key}.ratio", ratio))
        for key, pin in pins:
            if key is not None:
                setting(key, pin, f"pin_memory={pin}", pin_memory=pin)
        if pins:
            values = {p for _, p in pins}
            out.fields["pin_memory"] = all(values)
            if len(values) > 1:
                out.not_modelled.append(NotModelled(f, None, "pin_memory", [p for _, p in pins],
                                                    "pinned for one offload and pageable for the other: estimated as "
                                                    "pageable for both"))

    def buckets(self) -> None:
        """Bucket sizes ("auto": hidden-size rules of transformers' integration)."""
        out, f, line, path = self.out, self.f, self.out.lines.get, self.path
        hidden, setting, zero, stage = self.hidden, self.setting, self.zero, self.stage
        for key, name, rule in (("reduce_bucket_size", "reduce_bucket_size", (1.0, "hidden_size^2")),
                                ("stage3_prefetch_bucket_size", "prefetch_bucket_size", (0.9, "int(0.9 x hidden_size^2)")),
                                ("sub_group_size", "sub_group_size", None)):
            if key not in zero:
                continue
            dotted, value = f"zero_optimization.{key}", zero[key]
            if value == "auto" and rule is None:
                n = getattr(_defaults(), name)
                setting(dotted, value, f"{name}={n} (auto: DeepSpeed drops it and takes its default; {DS_SOURCE})")
                continue
            if value == "auto" and rule is not None:
                if key.startswith("stage3") and stage != 3:
                    out.ignored.append(Ignored(f, line(dotted), dotted, value))
                    continue
                if hidden is None:
                    out.not_modelled.append(NotModelled(
                        f, line(dotted), dotted, value, f"auto = {rule[1]} of the model, and no model is named: "
                        f"DeepSpeed's default {getattr(_defaults(), name):,} elements is estimated until --model is given"))
                    continue
                n = int(rule[0] * hidden * hidden)
                setting(dotted, value, f"{name}={n} (auto -> {rule[1]}, hidden_size {hidden}; {HF_SOURCE})", **{name: n})
                continue
            if key == "sub_group_size" and value == 0:      # DeepSpeed accepts 0 (Field(ge=0)); axolotl's zero3 files use it
                setting(dotted, value, "sub_group_size=1 (0 and 1 both close a sub-group after every parameter in stage 3's "
                                       "grouping: DeepSpeed 0.19.8 runtime/zero/stage3.py)", **{name: 1})
                continue
            n = _number(path, dotted, value)
            from helpers.training import MAX_ELEMENTS

            if name == "sub_group_size" and n > MAX_ELEMENTS:
                # a sub-group larger than the partition is the whole partition in one group (transformers' own
                # tests/deepspeed/ds_config_zero3.json sets 1e14): the same as any size above every model's count
                setting(dotted, value, f"{name}={MAX_ELEMENTS} (any size above the partition's parameter count is one "
                                       f"group; {n:,} elements is estimated as {MAX_ELEMENTS:,})", **{name: MAX_ELEMENTS})
                continue
            setting(dotted, value, f"{name}={n}", **{name: n})
        if "overlap_comm" in zero and zero["overlap_comm"] != "auto":
            v = zero["overlap_comm"]
            if not isinstance(v, bool):
                raise ConfigError(path, f"zero_optimization.overlap_comm must be true or false, got {v!r}")
            setting("zero_optimization.overlap_comm", v, f"overlap_comm={v}", overlap_comm=v)
        elif stage in (1, 2, 3):
            if "overlap_comm" in zero:            # "auto": dropped by DeepSpeedConfigModel, so its default applies
                out.ignored.append(Ignored(f, line("zero_optimization.overlap_comm"), "zero_optimization.overlap_comm",
                                           "auto (DeepSpeed's default below)"))
            out.defaults.append(Default(DS_VERSION, "zero_optimization.overlap_comm", stage == 3,
                                        f"overlap_comm={stage == 3}", DS_SOURCE + ": None -> True for stage 3 only",
                                        {"overlap_comm": stage == 3}))

    def precision(self) -> None:
        """Precision."""
        out, f, line, data = self.out, self.f, self.out.lines.get, self.data
        path, trainer, setting, from_trainer, matches = self.path, self.trainer, self.setting, self.from_trainer, self.matches
        bf16 = _enabled(path, data, "bf16") if "bf16" in data else _enabled(path, data, "bfloat16")
        bf16_key = "bf16.enabled" if "bf16" in data else "bfloat16.enabled"
        fp16 = _enabled(path, data, "fp16")
        unsaid = bf16 is None and (trainer is None or "bf16" not in trainer)    # no file says bf16
        if bf16 == "auto":
            bf16 = from_trainer("bf16", bf16_key, lambda v: f"precision={'bf16-mixed' if v else 'fp32'}",
                                lambda v: {"precision": "bf16-mixed" if v else "fp32"})
        elif bf16 is not None:
            matches("bf16", bf16_key, bf16)
            setting(bf16_key, bf16, f"precision={'bf16-mixed' if bf16 else 'fp32'}",
                    precision="bf16-mixed" if bf16 else "fp32")
        elif trainer is not None and "bf16" in trainer:
            bf16 = trainer["bf16"][0]
        if fp16 == "auto":
            fp16 = from_trainer("fp16", "fp16.enabled", lambda v: "fp16 (not modelled)" if v else "fp16 off")
        elif fp16 is not None:
            matches("fp16", "fp16.enabled", fp16)
        elif trainer is not None and "fp16" in trainer:
            fp16 = trainer["fp16"][0]
        if _enabled(path, data, "fp16") is True and (_enabled(path, data, "bf16") if "bf16" in data
                                                      else _enabled(path, data, "bfloat16")) is True:
            raise ConfigError(path, f"{bf16_key} and fp16.enabled are both on: DeepSpeed refuses that ('bfloat16 and "
                                    f"fp16 modes cannot be simultaneously enabled', runtime/config.py); keep one")
        if fp16:
            out.not_modelled.append(NotModelled(f, line("fp16.enabled"), "fp16.enabled", True,
                                                "fp16 mixed precision (loss scaling) is not modelled: estimated as "
                                                "bf16-mixed, which keeps the same bytes per value"))
            if not bf16:
                setting("fp16.enabled", True, "precision=bf16-mixed (fp16's stand-in: the same bytes per value)",
                        precision="bf16-mixed")
        elif unsaid:
            out.defaults.append(Default(DS_VERSION, "bf16.enabled", False, "precision=fp32", DS_SOURCE,
                                        {"precision": "fp32"}))
        out.fields["precision"] = "bf16-mixed" if (bf16 or fp16) else "fp32"

    def sizes(self) -> None:
        """Sizes."""
        out, f, line, data = self.out, self.f, self.out.lines.get, self.data
        path, trainer, setting, from_trainer, matches = self.path, self.trainer, self.setting, self.from_trainer, self.matches
        def size(ds_key: str, name: str, field: str):
            """A micro-batch-like count: "auto" takes the trainer's `name`, a number must match it; sets `field`."""
            value = data.get(ds_key)
            if value == "auto":
                value = from_trainer(name, ds_key, lambda v: f"{field}={v}", lambda v: {field: v})
            elif value is not None:
                value = _number(path, ds_key, value)
                matches(name, ds_key, value)
                setting(ds_key, value, f"{field}={value}", **{field: value})
            if value is not None:
                out.fields[field] = value
            return value

        micro = size("train_micro_batch_size_per_gpu", "per_device_train_batch_size", "batch")
        accum = size("gradient_accumulation_steps", "gradient_accumulation_steps", "grad_accum")
        total = data.get("train_batch_size")
        if total == "auto":
            out.ignored.append(Ignored(f, line("train_batch_size"), "train_batch_size",
                                       "auto (world size x micro batch x accumulation)"))
        elif total is not None:
            total = _number(path, "train_batch_size", total)
            if micro is not None and accum is not None:
                if total % (micro * accum):
                    raise ConfigError(path, f"train_batch_size {total} is not world size x micro batch {micro} x "
                                            f"accumulation {accum}, as DeepSpeed requires")
                gpus = total // (micro * accum)
                setting("train_batch_size", total, f"gpus={gpus} (= {total} / ({micro} x {accum}), DeepSpeed's "
                                                   f"train_batch_size = world size x micro batch x accumulation)",
                        gpus=gpus)
            elif micro is None and trainer is None:
                # DeepSpeed derives the micro batch: train_batch_size / (accumulation x world size) (runtime/config.py
                # _set_batch_related_parameters); alone, the world size is the gpus=1 default, so it is all one GPU's
                steps = accum if accum is not None else 1
                if total % steps:
                    raise ConfigError(path, f"train_batch_size {total} is not a multiple of gradient_accumulation_steps "
                                            f"{steps}, as DeepSpeed requires")
                micro = total // steps
                setting("train_batch_size", total, f"batch={micro} (DeepSpeed's micro batch = train_batch_size / "
                                                   f"(accumulation {steps} x world size), world size 1: with N GPUs "
                                                   f"it is {total}/({steps} x N))", batch=micro)
                if accum is None:
                    out.fields["grad_accum"] = 1
                out.per_world = {"field": "batch", "total": total, "by": steps}
            elif accum is None and trainer is None:
                # the micro batch given, the accumulation derived: train_batch_size / (micro batch x world size)
                if total % micro:
                    raise ConfigError(path, f"train_batch_size {total} is not a multiple of "
                                            f"train_micro_batch_size_per_gpu {micro}, as DeepSpeed requires")
                steps = total // micro
                setting("train_batch_size", total, f"grad_accum={steps} (DeepSpeed's accumulation = train_batch_size "
                                                   f"/ (micro batch {micro} x world size), world size 1: with N GPUs "
                                                   f"it is {total}/({micro} x N))", grad_accum=steps)
                out.per_world = {"field": "grad_accum", "total": total, "by": micro}
            elif trainer is not None and "per_device_train_batch_size" in trainer:
                # the HF Trainer's own sizes: it fills and matches train_batch_size = world size x micro batch x
                # accumulation (integrations/deepspeed.py trainer_config_process / trainer_config_finalize refuses a
                # mismatch), so the world size is what makes them agree
                m = micro if micro is not None else trainer["per_device_train_batch_size"][0]
                a = accum if accum is not None else trainer.get("gradient_accumulation_steps", (1, ""))[0]
                if not isinstance(m, int) or not isinstance(a, int) or m < 1 or a < 1 or total % (m * a):
                    raise ConfigError(path, f"train_batch_size {total} is not world size x micro batch {m} x "
                                            f"accumulation {a}: the HF Trainer refuses that mismatch")
                gpus = total // (m * a)
                setting("train_batch_size", total, f"gpus={gpus} (= {total} / ({m} x {a}), the trainer's micro batch "
                                                   f"and accumulation: train_batch_size = world size x micro batch x "
                                                   f"accumulation)", gpus=gpus)
            else:
                out.not_modelled.append(NotModelled(
                    f, line("train_batch_size"), "train_batch_size", total,
                    "with no train_micro_batch_size_per_gpu, DeepSpeed's micro batch is train_batch_size / (accumulation "
                    "x world size); the batch is estimated from the other files"))

    def ds_checkpointing(self) -> None:
        """DeepSpeed's own activation checkpointing."""
        out, f, line, data = self.out, self.f, self.out.lines.get, self.data
        if "activation_checkpointing" in data:
            out.not_modelled.append(NotModelled(
                f, line("activation_checkpointing"), "activation_checkpointing", data["activation_checkpointing"],
                "configures deepspeed.checkpointing.checkpoint(), used only by model code that calls it (Megatron-style "
                "models); a transformers model checkpoints through gradient_checkpointing instead, so this does not turn "
                "checkpointing on; its partition_activations / cpu_checkpointing are not modelled"))

    def optimizer(self) -> None:
        """Optimizer."""
        out, f, line, data, setting = self.out, self.f, self.out.lines.get, self.data, self.setting
        opt = data.get("optimizer")
        if self.stage == 3 and not (isinstance(opt, dict) and "type" in opt):
            out.default(self.hf, "optimizer (no block in the JSON)", "Trainer.create_optimizer",
                        "transformers Trainer.create_optimizer (deepspeed_optim_sched hands it over when the JSON "
                        "names no optimizer): two parameter groups, the weights, then the biases and norm weights "
                        "without weight decay; a script that hands DeepSpeed model.parameters() has one "
                        "(--optimizer-groups one)", "optimizer_groups='decay' (ZeRO-3 sub-groups per group)",
                        optimizer_groups="decay")
        if isinstance(opt, dict) and "type" in opt:
            kind = str(opt["type"])
            out.engine_optimizer = kind
            params = opt.get("params") if isinstance(opt.get("params"), dict) else {}
            if kind.lower() in ("adam", "adamw", "fusedadam", "cpuadam"):
                if self.stage == 3:
                    setting("optimizer.type", kind, "optimizer=adamw, optimizer_groups='one' (the HF Trainer hands "
                            "DeepSpeed DummyOptim(model_parameters) when the JSON names an optimizer: one parameter "
                            "group, split into ZeRO-3 sub-groups whole; transformers integrations/deepspeed.py "
                            "deepspeed_optim_sched)", optimizer_groups="one")
                else:
                    setting("optimizer.type", kind, "optimizer=adamw")
                if "torch_adam" in params:
                    self.torch_adam(params)
            else:
                out.not_modelled.append(NotModelled(f, line("optimizer.type"), "optimizer.type", kind,
                                                    "only Adam/AdamW (two states per parameter) is modelled"))

    def torch_adam(self, params: dict) -> None:
        """`optimizer.params.torch_adam`: DeepSpeed builds torch.optim.AdamW instead of FusedAdam / DeepSpeedCPUAdam
        (DeepSpeed 0.19.8 engine.py get_optimizer_configuration: with its `foreach` and the other params, e.g.
        `fused`), which then steps over the flat fp32 partitions as a client optimizer does."""
        on = boolean(self.f, "optimizer.params.torch_adam", params["torch_adam"])
        if not on:
            self.setting("optimizer.params.torch_adam", False, "DeepSpeed's own Adam")
        elif self.out.fields.get("offload_optimizer"):
            self.out.not_modelled.append(NotModelled(
                self.f, self.out.lines.get("optimizer.params.torch_adam"), "optimizer.params.torch_adam", True,
                "torch's AdamW stepping the offloaded partitions on the host is not modelled: estimated as "
                "DeepSpeedCPUAdam"))
        else:
            impl = ("fused" if params.get("fused") is True else "for-loop" if params.get("foreach") is False
                    else "foreach")
            self.setting("optimizer.params.torch_adam", True, f"adam_impl={impl} (torch.optim.AdamW in place of "
                                                              f"FusedAdam)", adam_impl=impl)

    def saves(self) -> None:
        """stage3_gather_16bit_weights_on_model_save (and its older names) -> save_16bit: the whole 16-bit model
        gathered on rank 0's host at each save (ZeRO-3 only; DeepSpeed's default false)."""
        out, f, line, zero = self.out, self.f, self.out.lines.get, self.zero
        keys = [k for k in ("stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
                            "stage3_gather_fp16_weights_on_model_save") if k in zero]
        if self.stage != 3:
            for k in keys:
                out.ignored.append(Ignored(f, line(f"zero_optimization.{k}"), f"zero_optimization.{k}", zero[k]))
            return
        if not keys:
            out.default(DS_VERSION, "zero_optimization.stage3_gather_16bit_weights_on_model_save", False, DS_SOURCE,
                        "save_16bit=False", save_16bit=False)
            return
        dotted, value = f"zero_optimization.{keys[0]}", zero[keys[0]]
        if value == "auto":
            self.setting(dotted, value, "save_16bit=False (auto -> accelerate's zero3_save_16bit_model, false unless "
                                        "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL=true: accelerate 1.15 "
                                        "utils/dataclasses.py DeepSpeedPlugin, which the Trainer builds)",
                         save_16bit=False)
        elif isinstance(value, bool):
            self.setting(dotted, value, f"save_16bit={value}", save_16bit=value)
        else:
            raise ConfigError(self.path, f"{dotted} must be true, false or \"auto\", got {value!r}")

    def rest(self) -> None:
        """The rest: not modelled (listed) or ignored."""
        out, f, line, data, hidden, stage = self.out, self.f, self.out.lines.get, self.data, self.hidden, self.stage
        for key, value in _leaves(data):
            if key in READ or any(key.startswith(k + ".") for k in ("activation_checkpointing",)):
                continue
            why = next((w for k, w in NOT_MODELLED.items() if key == k or key.startswith(k + ".")), None)
            if why is not None:
                if key.endswith("stage3_param_persistence_threshold") and value == "auto" and hidden and stage == 3:
                    why += f" (auto -> 10 x hidden_size = {10 * hidden:,} elements; {HF_SOURCE})"
                out.not_modelled.append(NotModelled(f, line(key), key, value, why))
            else:
                out.ignored.append(Ignored(f, line(key), key, value))


def _defaults():
    from helpers.training import TrainSetup

    return TrainSetup()


def _stage(path, key: str, value) -> int:
    """A ZeRO stage 0-3. DeepSpeed validates it with pydantic in lax mode (runtime/zero/config.py `stage:
    ZeroStageEnum`), which also takes "3", 3.0, and true/false as 1/0 (checked: DeepSpeedZeroConfig(stage=True).stage
    is 1 in 0.19.8) -- so do we; any other value is refused."""
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, str) and value.strip() in ("0", "1", "2", "3"):
        value = int(value)
    elif isinstance(value, float) and value in (0, 1, 2, 3):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value not in STAGES:
        raise ConfigError(path, f"{key} must be 0, 1, 2 or 3, got {value!r}")
    return value


def _enabled(path, data: dict, section: str):
    """True/False/'auto' for `section.enabled` (None if the section is absent; DeepSpeed's default is off)."""
    sub = data.get(section)
    if sub is None:
        return None
    if not isinstance(sub, dict):
        raise ConfigError(path, f"{section} must be an object with an 'enabled' key, got {sub!r}")
    v = sub.get("enabled", False)
    if v != "auto" and not isinstance(v, bool):
        raise ConfigError(path, f"{section}.enabled must be true, false or \"auto\", got {v!r}")
    return v


def _leaves(data: dict, prefix: str = ""):
    """(dotted key, value) of every leaf, sections that are whole values (lists) kept whole."""
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and (key in CONTAINERS or key.startswith("zero_optimization.")):
            yield from _leaves(v, key)
        else:
            yield key, v
