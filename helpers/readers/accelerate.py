"""Reader of an accelerate config YAML (what `accelerate config` writes, `accelerate launch --config_file x.yaml`),
alone or as the companion of a TRL YAML (`apply()`, which the TRL reader calls).

Sources: accelerate 1.15.0 (installed): `commands/config/config_args.py` (ClusterConfig: distributed_type,
num_processes -- all processes, over every machine --, num_machines, mixed_precision, deepspeed_config, fsdp_config),
`utils/dataclasses.py` (DeepSpeedPlugin: zero_stage default 2, offload_*_device default "none",
deepspeed_config_file; FullyShardedDataParallelPlugin: fsdp_version default 1, reshard_after_forward FULL_SHARD for
version 1 and True for version 2, cpu_offload, activation_checkpointing). With transformers' Trainer (TRL), the
TrainingArguments' bf16/fp16 set ACCELERATE_MIXED_PRECISION and win over the config's mixed_precision
(transformers `training_args.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers.estimate import loading
from helpers.readers import base, collect
from helpers.readers.base import ConfigError, Imported, did_you_mean
from helpers.readers.provenance import Record

NAME = "accelerate"
TOOL = "accelerate 1.15.0"
SRC = "accelerate 1.15.0 utils/dataclasses.py"
KINDS = {"NO": "single", "MULTI_GPU": "ddp", "DEEPSPEED": None, "FSDP": None}
FULL = {"FULL_SHARD", "1", True, "true", 1}



def _truth(path, key: str, value) -> bool:
    """A value accelerate reads with str_to_bool (utils/environment.py): y, yes, t, true, on, 1 or n, no, f, false,
    off, 0 in any case; anything else stops it ('invalid truth value')."""
    if isinstance(value, bool):
        return value
    word = str(value).lower()
    if word in ("y", "yes", "t", "true", "on", "1"):
        return True
    if word in ("n", "no", "f", "false", "off", "0"):
        return False
    raise ConfigError(path, f"{key} {value!r} is not true or false, which is what FSDP2 takes (accelerate's "
                            f"str_to_bool stops: 'invalid truth value'); FULL_SHARD and the other strategy names are "
                            f"FSDP1's")


def reduce_in_bf16(c: Record) -> None:
    """FSDP2 through accelerate: its MixedPrecisionPolicy reduces in the compute dtype (bf16 under bf16 mixed
    precision), not in fp32 as torchtitan does."""
    c.default(TOOL, "(FSDP2 mixed precision policy)", "param_dtype = reduce_dtype = bf16",
              SRC + " FullyShardedDataParallelPlugin.set_mixed_precision: MixedPrecisionPolicy(param_dtype=dtype, "
              "reduce_dtype=dtype)", "reduce_dtype=bf16 (under bf16 mixed precision)", reduce_dtype="bf16")


def _sharding_strategy(path, key: str, value) -> str:
    """fsdp_sharding_strategy as accelerate reads it (utils/dataclasses.py FullyShardedDataParallelPlugin): a name of
    FSDP_SHARDING_STRATEGY in any case, or a number that is torch's ShardingStrategy value (1 FULL_SHARD,
    2 SHARD_GRAD_OP, 3 NO_SHARD, 4 HYBRID_SHARD, 5 _HYBRID_SHARD_ZERO2); anything else stops accelerate."""
    from accelerate.utils.constants import FSDP_SHARDING_STRATEGY
    from torch.distributed.fsdp import ShardingStrategy

    allowed = ", ".join(f"{s.value} {s.name.lstrip('_')}" for s in ShardingStrategy)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(path, f"{key} must be a sharding strategy ({allowed}), got {value!r}")
    if isinstance(value, str) and value.upper() in FSDP_SHARDING_STRATEGY:
        return value.upper()
    if isinstance(value, int) or value.isdigit():
        try:
            return ShardingStrategy(int(value)).name.lstrip("_")
        except ValueError:
            raise ConfigError(path, f"{key} {value!r} is no torch ShardingStrategy ({allowed}): accelerate stops on "
                                    f"it") from None
    if value.upper() in ShardingStrategy.__members__:
        return value.upper()
    raise ConfigError(path, f"{key} {value!r} is none of accelerate's sharding strategies ({allowed})"
                      + did_you_mean(value.upper(), list(FSDP_SHARDING_STRATEGY), 0.6))

def claims(path: Path, data) -> bool:
    """A YAML mapping with accelerate's own keys (distributed_type, compute_environment)."""
    return (Path(path).suffix.lower() in (".yaml", ".yml") and isinstance(data, dict)
            and bool({"distributed_type", "compute_environment"} & set(data)))


def read(path: Path, data, lines: dict[str, int], given: list[Path]) -> Imported:
    """An accelerate config alone: no model (the CLI asks for --model), its DeepSpeed file if it names one."""
    c, files = apply(path, data, lines, given, trainer=None, hidden=None)
    c.files += files
    return c.finish(None, None)


def _refuse_unknown(path: Path, data: dict) -> None:
    """ConfigError for a top-level key accelerate's ClusterConfig has no field for: `accelerate launch` refuses the
    file then ('had unknown keys', commands/config/config_args.py BaseConfig.from_yaml_file), so the run never starts."""
    import difflib

    from accelerate.commands.config.config_args import ClusterConfig

    known = sorted(ClusterConfig.__dataclass_fields__)
    for key in data:
        if key not in known:
            near = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            raise ConfigError(path, f"unknown key {key!r}" + (f": did you mean {near[0]!r}?" if near else "")
                                    + " (accelerate launch refuses a config file with keys its ClusterConfig lacks)")


def apply(path: Path, data, lines: dict[str, int], given: list[Path], trainer: dict[str, tuple[Any, str]] | None,
          hidden: int | None) -> tuple[Record, list[str]]:
    """What an accelerate config does to a set-up, and the files it read (its DeepSpeed config file).

    trainer: the TrainingArguments values of the script's own config (see deepspeed.apply); when given, its
    precision wins over mixed_precision (as transformers' Trainer does)."""
    data = collect.read_yaml_mapping(path, data)
    _refuse_unknown(path, data)
    c = Record(NAME, path, lines)
    done = {"distributed_type", "num_processes", "num_machines", "mixed_precision", "deepspeed_config", "fsdp_config",
            "parallelism_config"}
    kind = data.get("distributed_type", "NO")
    if not isinstance(kind, str):
        hint = " (YAML reads an unquoted NO as false: write 'NO', as accelerate config does)" if kind is False else ""
        raise ConfigError(path, f"distributed_type must be a name (NO, MULTI_GPU, DEEPSPEED, FSDP, ...), got "
                                f"{kind!r}{hint}")
    if "distributed_type" not in data:
        c.default(TOOL, "distributed_type", "NO", "accelerate config_args.py", "strategy=single", strategy="single")
    from accelerate.utils import DistributedType

    names = [d.value for d in DistributedType]
    if kind not in names:                        # accelerate's config loader refuses it (DistributedType(value))
        import difflib

        near = difflib.get_close_matches(kind.upper(), names, n=1, cutoff=0.6)
        raise ConfigError(path, f"distributed_type {kind!r} is none of accelerate's ({', '.join(names)}): its config "
                                f"loader refuses it" + (f"; did you mean {near[0]!r}?" if near else ""))
    if kind not in KINDS and kind.startswith("MULTI_"):
        c.unmodelled("distributed_type", kind, f"{kind}: data parallel on another accelerator; estimated as DDP on "
                                               f"GPUs")
        c.set("distributed_type", kind, "strategy=ddp (the stand-in for data parallel on another accelerator)",
              strategy="ddp")
    elif kind not in KINDS:
        c.unmodelled("distributed_type", kind, f"{kind} is not modelled (NO, MULTI_GPU, DEEPSPEED and FSDP are); "
                                               f"estimated as one GPU")
        kind = "NO"
    elif KINDS[kind]:
        c.set("distributed_type", kind, f"strategy={KINDS[kind]}", strategy=KINDS[kind])

    # --- world size
    procs, machines = data.get("num_processes"), data.get("num_machines", 1)
    if data.get("use_cpu") is True:                      # accelerate runs on the CPU: no GPU estimate applies
        raise ConfigError(path, "use_cpu: true runs the training on the CPU (accelerate's ClusterConfig), which this "
                                "package does not estimate")
    machines = c.integer("num_machines", machines)
    if kind == "NO" and procs not in (None, -1, 1):
        # commands/launch.py: distributed_type NO sets no multi_gpu, and launch_command then runs simple_launcher,
        # one process, whatever num_processes says (TRL's own accelerate_configs/single_gpu.yaml has 8)
        c.set("num_processes", procs, "gpus=1 (distributed_type NO: accelerate starts one process)", gpus=1)
    elif procs is not None and procs != -1:
        procs = c.integer("num_processes", procs)
        if procs % machines:
            # accelerate launches num_processes // num_machines per machine (utils/launch.py, nproc_per_node)
            raise ConfigError(path, f"num_processes {procs} is not a multiple of num_machines {machines}: accelerate "
                                    f"starts num_processes // num_machines = {procs // machines} per machine")
        per_node = procs // machines
        c.set("num_processes", procs, f"gpus={procs} (all processes, every machine)", gpus=procs)
        if "num_machines" in data:
            c.set("num_machines", machines, f"gpus_per_node={per_node}", gpus_per_node=per_node)
    else:
        c.ignore("num_processes", procs)

    # --- precision (the Trainer's bf16/fp16 win when a trainer config is given)
    mp = data.get("mixed_precision", "no")
    if mp not in ("no", "bf16", "fp16", "fp8"):
        raise ConfigError(path, f"mixed_precision must be no, bf16, fp16 or fp8, got {mp!r}")
    if trainer is not None:
        c.set("mixed_precision", mp, "overridden by the training config's bf16/fp16 (TrainingArguments sets "
                                     "ACCELERATE_MIXED_PRECISION, transformers training_args.py)")
    elif mp in ("no", "bf16"):
        c.set("mixed_precision", mp, f"precision={'fp32' if mp == 'no' else 'bf16-mixed'}",
              precision="fp32" if mp == "no" else "bf16-mixed")
    elif mp == "fp16":
        c.set("mixed_precision", mp, "precision=fp16-mixed (torch autocast in fp16 with GradScaler)",
              precision="fp16-mixed")
    else:
        c.set("mixed_precision", mp, "precision=bf16-mixed (same bytes)", precision="bf16-mixed")
        c.unmodelled("mixed_precision", mp, f"{mp} mixed precision is not modelled: estimated as bf16-mixed")

    files: list[str] = []
    if kind == "DEEPSPEED":
        files += _deepspeed(c, path, data.get("deepspeed_config") or {}, given, trainer, hidden)
    elif data.get("deepspeed_config"):
        c.ignore("deepspeed_config", data["deepspeed_config"])
    if kind == "FSDP":
        _fsdp(c, data.get("fsdp_config") or {})
    elif data.get("fsdp_config"):
        c.ignore("fsdp_config", data["fsdp_config"])
    _parallelism(c, data.get("parallelism_config"))
    for key, value in data.items():
        if key not in done:
            c.ignore(key, value)
    return c, files


def _parallelism(c: Record, par) -> None:
    """accelerate's parallelism_config (accelerate 1.15.0 `parallelism_config.py` ParallelismConfig, keys
    parallelism_config_{dp_replicate,dp_shard,tp,cp,sp}_size as `accelerate launch` writes them): tensor and context
    parallel degrees where TrainSetup and the strategy take them; the rest listed."""
    from helpers import strategies

    if par is None:
        return
    if not isinstance(par, dict):
        raise ConfigError(c.path, f"parallelism_config must be a mapping, got {par!r}")
    p = "parallelism_config."
    strategy = c.fields.get("strategy", "single")
    total = 1
    for key, value in par.items():
        short = key.removeprefix("parallelism_config_")
        if short in ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size"):
            n = c.integer(p + key, value)
            total *= n
            field = {"tp_size": "tensor_parallel", "cp_size": "context_parallel"}.get(short)
            if n == 1 or short == "dp_shard_size":
                c.set(p + key, n, f"{short}={n}" + (" (FSDP shards over the data-parallel GPUs)" if n > 1 else ""))
            elif short == "dp_replicate_size" and strategy == "fsdp2":
                c.set(p + key, n, f"dp_replicate={n} (HSDP: {n} groups, each sharding over its own GPUs)",
                      dp_replicate=n)
            elif field and strategy in strategies.NAMES and strategies.get(strategy).model_parallel:
                c.set(p + key, n, f"{field}={n}", **{field: n})
            else:
                c.unmodelled(p + key, n, {"dp_replicate_size": "replicated FSDP groups (HSDP): each shards over "
                                                               "fewer GPUs; estimated as sharding over all",
                                          "sp_size": "sequence parallelism (DeepSpeed Ulysses) splits activations "
                                                     "over the GPUs; estimated without it"}.get(
                    short, f"{short} {n} with strategy {strategy} is not modelled: estimated without it"))
        else:
            c.ignore(p + key, value)
    gpus = c.fields.get("gpus")
    if gpus is not None and total != gpus:      # accelerate 1.15 parallelism_config.py _validate_accelerator
        raise ConfigError(c.path, f"parallelism_config's sizes multiply to {total}, but num_processes is {gpus}: "
                                  f"accelerate stops ('ParallelismConfig total_size ({total}) does not match "
                                  f"num_processes ({gpus})'); make dp_replicate x dp_shard x tp x cp x sp equal it")


# deepspeed_config keys accelerate refuses beside a deepspeed_config_file (accelerate 1.15 utils/dataclasses.py
# DeepSpeedPlugin._deepspeed_config_checks: they are read from ACCELERATE_CONFIG_DS_FIELDS)
WITH_CONFIG_FILE = {"gradient_accumulation_steps", "gradient_clipping", "zero_stage", "offload_optimizer_device",
                    "offload_param_device", "offload_param_nvme_path", "offload_optimizer_nvme_path",
                    "zero3_save_16bit_model", "mixed_precision"}


def _deepspeed(c: Record, path: Path, ds: dict, given, trainer, hidden) -> list[str]:
    """accelerate's deepspeed_config: a DeepSpeed JSON (deepspeed_config_file) or its own few keys."""
    from helpers.readers import deepspeed

    if not isinstance(ds, dict):
        raise ConfigError(path, f"deepspeed_config must be a mapping, got {ds!r}")
    p = "deepspeed_config."
    ref = ds.get("deepspeed_config_file")
    both = sorted(set(ds) & WITH_CONFIG_FILE) if ref else []
    if both:                            # utils/dataclasses.py DeepSpeedPlugin._deepspeed_config_checks
        raise ConfigError(path, f"deepspeed_config_file beside {', '.join(p + k for k in both)}: accelerate refuses "
                                f"the pair ('When using `deepspeed_config_file`, the following accelerate config "
                                f"variables will be ignored'); set them in the DeepSpeed file instead")
    if ref:
        ds_path = base.companion(str(ref), Path(path), given, what="DeepSpeed config")
        c.set(p + "deepspeed_config_file", ref, f"the DeepSpeed config {ds_path.name} (read below)")
        data, lines = collect.load_deepspeed(ds_path, Path(path), p + "deepspeed_config_file")
        applied = deepspeed.apply(ds_path, data, lines, trainer, hidden)
        started, implied = c.fields.get("gpus"), applied.fields.get("gpus")
        if started is not None and implied is not None and started != implied:
            raise ConfigError(ds_path, f"train_batch_size gives {implied} GPUs (world size x micro batch x "
                                       f"accumulation), but {Path(path).name}'s num_processes starts {started}: the "
                                       f"HF Trainer refuses the mismatch (integrations/deepspeed.py "
                                       f"trainer_config_finalize); make them agree, or set train_batch_size to "
                                       f"\"auto\"")
        if trainer is None and not {"bf16", "bfloat16", "fp16"} & set(data):
            # accelerate fills the missing section from mixed_precision (DeepSpeedPlugin.set_mixed_precision)
            applied.fields.pop("precision", None)
        c.merge(applied)
        for key in ds:
            if key == "zero3_init_flag" and c.fields.get("strategy") == "zero3":
                _zero3_init(c, p, ds[key])
            elif key != "deepspeed_config_file":
                c.ignore(p + key, ds[key])
        return [str(ds_path)]
    stage = ds.get("zero_stage")
    if stage is None:
        c.default(TOOL, p + "zero_stage", 2, SRC + " DeepSpeedPlugin.zero_stage", "strategy=zero2", strategy="zero2")
        stage = 2
    else:
        stage = deepspeed._stage(path, p + "zero_stage", stage)
        c.set(p + "zero_stage", stage, f"strategy={deepspeed.STAGES[stage]}", strategy=deepspeed.STAGES[stage])
    for key, flag in (("offload_optimizer_device", "offload_optimizer"), ("offload_param_device", "offload_params")):
        device = ds.get(key, "none")
        if key not in ds:
            continue
        if not isinstance(device, str):
            raise ConfigError(path, f"{p}{key} must be none, cpu or nvme, got {device!r}")
        if device == "nvme":
            c.unmodelled(p + key, device, "NVMe offload is not modelled")
        elif device == "cpu" and flag == "offload_params" and stage != 3:
            c.ignore(p + key, device)
        elif device in ("cpu", "none"):
            c.set(p + key, device, f"{flag}={device == 'cpu'}", **{flag: device == "cpu"})
        else:
            raise ConfigError(path, f"{p}{key} must be none, cpu or nvme, got {device!r}")
    if "gradient_accumulation_steps" in ds:
        n = c.integer(p + "gradient_accumulation_steps", ds["gradient_accumulation_steps"])
        theirs = (trainer or {}).get("gradient_accumulation_steps")
        if theirs is not None and theirs[0] != n:
            c.set(p + "gradient_accumulation_steps", n, "overridden by the training config's "
                                                        "gradient_accumulation_steps")
        else:
            c.set(p + "gradient_accumulation_steps", n, f"grad_accum={n}", grad_accum=n)
    if "zero3_init_flag" in ds and stage == 3:
        _zero3_init(c, p, ds["zero3_init_flag"])
    if "zero3_save_16bit_model" in ds and stage == 3:       # DeepSpeedPlugin -> stage3_gather_16bit_weights_on_model_save
        on = c.flag(p + "zero3_save_16bit_model", ds["zero3_save_16bit_model"])
        c.set(p + "zero3_save_16bit_model", on, f"save_16bit={on}", save_16bit=on)
    elif stage == 3:
        c.default(TOOL, p + "zero3_save_16bit_model", False, SRC + " DeepSpeedPlugin.zero3_save_16bit_model "
                  "(ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL, false)", "save_16bit=False", save_16bit=False)
    if "zero3_init_flag" in ds and stage != 3 and ds["zero3_init_flag"] is False:
        # (no effect below stage 3; said, because a move to stage 3 with it keeps the whole model on every rank)
        c.set(p + "zero3_init_flag", False, f"none at stage {stage}; at 3: loads whole")
    for key in ds:
        if key not in ("zero_stage", "offload_optimizer_device", "offload_param_device", "gradient_accumulation_steps",
                       "zero3_save_16bit_model", "zero3_init_flag") or (
                key in ("zero3_save_16bit_model", "zero3_init_flag") and stage != 3
                and not (key == "zero3_init_flag" and ds[key] is False)):
            c.ignore(p + key, ds[key])
    return []


def _zero3_init(c: Record, p: str, value) -> None:
    """deepspeed_config.zero3_init_flag -> zero3_init: false builds the model whole before DeepSpeed partitions it
    (accelerate 1.15 DeepSpeedPlugin: unset, it follows the stage, true for ZeRO-3)."""
    on = c.flag(p + "zero3_init_flag", value)
    c.set(p + "zero3_init_flag", on, f"zero3_init={on}", zero3_init=on)


def _fsdp(c: Record, fsdp: dict) -> None:
    """accelerate's fsdp_config: version, sharding, offload, activation checkpointing."""

    p = "fsdp_config."
    if not isinstance(fsdp, dict):
        raise ConfigError(c.path, f"fsdp_config must be a mapping, got {fsdp!r}")
    version = fsdp.get("fsdp_version")
    if version is None:                           # one row: the default that sets the strategy
        c.default(TOOL, p + "fsdp_version", 1, SRC + " FullyShardedDataParallelPlugin.fsdp_version",
                  "strategy=fsdp1 (FSDP1)", strategy="fsdp1")
        version = 1
    elif isinstance(version, bool) or version not in (1, 2):
        raise ConfigError(c.path, f"{p}fsdp_version must be 1 or 2, got {version!r}")
    elif version == 2:
        c.set(p + "fsdp_version", 2, "strategy=fsdp2", strategy="fsdp2")
    if version == 2:
        reduce_in_bf16(c)
    else:
        c.set(p + "fsdp_version", 1, "strategy=fsdp1", strategy="fsdp1")
    if version == 2:                      # utils/dataclasses.py: FSDP2 reads reshard_after_forward alone, a bool
        shard_key = p + "fsdp_reshard_after_forward"
        shard = fsdp.get("fsdp_reshard_after_forward")
        if shard is not None:
            shard = _truth(c.path, shard_key, shard)
        if "fsdp_sharding_strategy" in fsdp:                   # (FSDP1's: deprecated, unread under FSDP2)
            c.set(p + "fsdp_sharding_strategy", fsdp["fsdp_sharding_strategy"],
                  "unread under FSDP2 (FSDP1's key): FSDP2 takes fsdp_reshard_after_forward, and hybrid sharding from "
                  "parallelism_config's dp_replicate_size")
    else:
        shard_key = p + ("fsdp_reshard_after_forward" if "fsdp_reshard_after_forward" in fsdp
                         else "fsdp_sharding_strategy")
        shard = fsdp.get(shard_key[len(p):])
        if shard is not None:
            shard = _sharding_strategy(c.path, shard_key, shard)
    if shard is not None:
        if shard in FULL or str(shard).upper() == "FULL_SHARD":
            c.set(shard_key, shard, "parameters, gradients and optimizer states sharded (full shard)")
        elif str(shard).upper() == "NO_SHARD":
            c.set(shard_key, shard, "strategy=ddp (nothing sharded)", strategy="ddp")
        elif shard is False or str(shard).upper() == "SHARD_GRAD_OP":
            c.set(shard_key, shard, "reshard_after_forward=False (parameters kept gathered from forward to backward)",
                  reshard_after_forward=False)
        elif str(shard).upper() == "HYBRID_SHARD":
            c.set(shard_key, shard, "hybrid_shard=True (sharded over each node's GPUs, replicated across nodes)",
                  hybrid_shard=True)
        elif str(shard).upper().lstrip("_") == "HYBRID_SHARD_ZERO2":
            c.set(shard_key, shard, "hybrid_shard=True, reshard_after_forward=False (sharded over each node's GPUs, "
                                    "parameters kept gathered from forward to backward)",
                  hybrid_shard=True, reshard_after_forward=False)
        else:
            raise ConfigError(c.path, f"{shard_key} {shard!r}: not a sharding strategy accelerate reads")
    offload = fsdp.get("fsdp_offload_params")
    if offload is not None:
        on = c.flag(p + "fsdp_offload_params", offload)
        c.set(p + "fsdp_offload_params", on, f"offload_optimizer={on}, offload_params={on} (CPUOffload: parameters, "
                                             f"gradients, optimizer states)", offload_optimizer=on, offload_params=on)
    ac = fsdp.get("fsdp_activation_checkpointing")
    if ac is not None:
        on = c.flag(p + "fsdp_activation_checkpointing", ac)
        if on:
            c.set(p + "fsdp_activation_checkpointing", on, "checkpointing=full", checkpointing="full")
        else:
            c.set(p + "fsdp_activation_checkpointing", on, "FSDP's own checkpointing wrapper off (the trainer's "
                                                           "gradient_checkpointing still applies)")
    kind = fsdp.get("fsdp_state_dict_type")
    if kind is not None:
        sharded = base.fsdp_sharded_save(c.path, p + "fsdp_state_dict_type", kind)
        c.set(p + "fsdp_state_dict_type", kind, f"sharded_save={sharded}", sharded_save=sharded)
    if "fsdp_use_orig_params" in fsdp and version == 1:      # (FSDP2 always keeps the original parameters)
        on = c.flag(p + "fsdp_use_orig_params", fsdp["fsdp_use_orig_params"])
        c.set(p + "fsdp_use_orig_params", on, f"use_orig_params={on}", use_orig_params=on)
    if "fsdp_cpu_ram_efficient_loading" in fsdp:
        on = c.flag(p + "fsdp_cpu_ram_efficient_loading", fsdp["fsdp_cpu_ram_efficient_loading"])
        c.set(p + "fsdp_cpu_ram_efficient_loading", on, loading.ram_efficient_words(on))
    for key, value in fsdp.items():
        if key not in ("fsdp_version", "fsdp_reshard_after_forward", "fsdp_sharding_strategy", "fsdp_offload_params",
                       "fsdp_activation_checkpointing", "fsdp_state_dict_type", "fsdp_cpu_ram_efficient_loading") \
                and (key != "fsdp_use_orig_params" or version != 1):
            c.ignore(p + key, value)


def launcher(c: Record, path: Path, given: list[Path], trainer: dict, hidden: int | None,
             own_deepspeed: bool = False) -> Path | None:
    """The accelerate config among the files given that the run is launched with (`accelerate launch --config_file
    acc.yaml ...`: TRL's scripts, LLaMA-Factory's src/train.py), applied to the record: the world size, the strategy
    and the DeepSpeed or FSDP settings it carries. One at most; None when none is given.

    own_deepspeed: the training YAML names its own DeepSpeed file (`deepspeed:`). TrainingArguments then builds the
    DeepSpeedPlugin from that file and the Trainer hands it to the Accelerator (transformers training_args.py
    `DeepSpeedPlugin(hf_ds_config=...)`, trainer.py `"deepspeed_plugin": self.args.deepspeed_plugin`), so an
    accelerate DEEPSPEED config's own DeepSpeed settings are replaced: only its world size is kept, the rest said
    superseded."""
    found: Path | None = None
    for other in given:
        other = Path(other)
        if other.resolve() == Path(path).resolve() or other.suffix.lower() not in (".yaml", ".yml"):
            continue
        odata, olines = base.load_yaml(other)
        if claims(other, odata):
            if found is not None and found.resolve() != other.resolve():
                raise ConfigError(other, f"a second accelerate config (with {found.name}): `accelerate launch "
                                         f"--config_file` takes one; give the one this run is launched with")
            found = other
            applied, files = apply(other, odata, olines, given, trainer, hidden)
            if own_deepspeed and odata.get("distributed_type") == "DEEPSPEED":
                _supersede(applied, path)
                files = []
            c.merge(applied)
            c.files += [str(other)] + files
    return found


KEPT_FROM_LAUNCHER = ("gpus", "gpus_per_node")


def _supersede(applied: Record, path: Path) -> None:
    """An accelerate DEEPSPEED config under a training YAML with its own `deepspeed:` file: its world size stays,
    every other field it would set is dropped and its entries say why."""
    why = f"superseded: {Path(path).name}'s deepspeed: file is the run's DeepSpeed config (the Trainer's DeepSpeedPlugin)"
    applied.fields = {k: v for k, v in applied.fields.items() if k in KEPT_FROM_LAUNCHER}
    kept = []
    for x in applied.settings:
        if set(x.fields) & set(KEPT_FROM_LAUNCHER):
            kept.append(x)
        else:
            kept.append(type(x)(x.file, x.line, x.key, x.value, why, {}))
    applied.settings = kept
    applied.defaults = [d for d in applied.defaults if set(d.fields) & set(KEPT_FROM_LAUNCHER)]
    applied.not_modelled = []
    applied.engine_optimizer = None
