"""torchtitan's training TOML (`--job.config_file x.toml`): model flavour, batch, sequence, precision, parallel
degrees, activation checkpointing, CPU offload and optimizer implementation.

Source read (keys and defaults): github:pytorch/torchtitan at commit 238fa9953e4a (2026-02-23, the last before the
TOML files were replaced by Python config registries in #2386): `torchtitan/config/job_config.py`,
`run_train.sh` (NGPU defaults to 8), `torchtitan/models/llama3/train_configs/llama3_8b.toml` (the preset this reader
must read), `torchtitan/models/attention.py` (SDPA limited to the cuDNN/flash/math backends). Older files (October
2024, commit ccfc02be8871, `torchtitan/config_manager.py`) spell some keys differently and are read too:
`training.batch_size`, the parallel degrees under [training], `experimental.context_parallel_degree` and
`pipeline_parallel_degree`, `training.enable_loss_parallel`, `training.compile`, `optimizer.fused`,
`[float8] enable_float8_linear`.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from helpers.readers.base import ConfigError, Imported, did_you_mean, get, leaves
from helpers.readers.provenance import Record, boolean, positive_int

NAME = "torchtitan"
TOOL = "torchtitan @238fa99 (job_config.py)"
SOURCE = "github:pytorch/torchtitan torchtitan/config/job_config.py @238fa9953e4a"
RUN_SCRIPT = "github:pytorch/torchtitan run_train.sh @238fa9953e4a: NGPU=${NGPU:-\"8\"}"
NGPU_DEFAULT = 8

# torchtitan's model name and flavour -> the catalogue's model (torchtitan's llama3 flavours are Llama 3.1's shapes:
# torchtitan/models/llama3/__init__.py, hf_assets_path ./assets/hf/Llama-3.1-8B in the 8B preset).
FLAVOURS = {
    ("llama3", "8B"): "llama-3.1-8b", ("llama3", "70B"): "llama-3.1-70b",
    ("qwen3", "0.6B"): "qwen3-0.6b", ("qwen3", "1.7B"): "qwen3-1.7b", ("qwen3", "4B"): "qwen3-4b",
    ("qwen3", "8B"): "qwen3-8b", ("qwen3", "14B"): "qwen3-14b", ("qwen3", "32B"): "qwen3-32b",
    ("qwen3", "30B-A3B"): "qwen3-30b-a3b", ("deepseek_v3", "671B"): "deepseek-v3",
}
# model.name values of torchtitan's models that are not text decoders (torchtitan/models/flux,
# torchtitan/experiments/vlm @238fa9953e4a): refused rather than estimated as one.
NOT_LANGUAGE = {"flux": "FLUX diffusion image model (torchtitan/models/flux)",
                "vlm": "vision-language model (torchtitan/experiments/vlm, a vision encoder beside the decoder)"}
SECTIONS = {"job", "profiling", "metrics", "model", "optimizer", "lr_scheduler", "training", "parallelism",
            "checkpoint", "activation_checkpoint", "compile", "float8", "quantize", "comm", "memory_estimation",
            "fault_tolerance", "experimental", "validation", "debug", "mx"}

# Keys read by this module, in both generations (new name first); anything else in the file is listed as ignored.
ALIASES = {
    "training.local_batch_size": ("training.local_batch_size", "training.batch_size"),
    "parallelism.data_parallel_replicate_degree": ("parallelism.data_parallel_replicate_degree",
                                                   "training.data_parallel_replicate_degree"),
    "parallelism.data_parallel_shard_degree": ("parallelism.data_parallel_shard_degree",
                                               "training.data_parallel_shard_degree"),
    "parallelism.tensor_parallel_degree": ("parallelism.tensor_parallel_degree", "training.tensor_parallel_degree"),
    "parallelism.context_parallel_degree": ("parallelism.context_parallel_degree",
                                            "experimental.context_parallel_degree"),
    "parallelism.pipeline_parallel_degree": ("parallelism.pipeline_parallel_degree",
                                             "experimental.pipeline_parallel_degree"),
    "parallelism.expert_parallel_degree": ("parallelism.expert_parallel_degree",),
    "parallelism.fsdp_reshard_after_forward": ("parallelism.fsdp_reshard_after_forward",),
    "compile.enable": ("compile.enable", "training.compile"),
    "checkpoint.enable": ("checkpoint.enable", "checkpoint.enable_checkpoint"),
}
DEFAULTS = {"training.local_batch_size": 8, "training.seq_len": 2048, "training.dtype": "float32",
            "training.mixed_precision_param": "bfloat16", "parallelism.data_parallel_replicate_degree": 1,
            "parallelism.data_parallel_shard_degree": -1, "parallelism.tensor_parallel_degree": 1,
            "parallelism.context_parallel_degree": 1, "parallelism.pipeline_parallel_degree": 1,
            "parallelism.fsdp_reshard_after_forward": "default", "activation_checkpoint.mode": "selective",
            "activation_checkpoint.selective_ac_option": "2", "training.enable_cpu_offload": False,
            "optimizer.name": "AdamW", "optimizer.implementation": "fused", "training.global_batch_size": -1,
            "model.name": "llama3", "model.flavor": "debugmodel", "checkpoint.enable": False,
            "checkpoint.async_mode": "disabled"}


@functools.cache
def job_config() -> dict:
    """torchtitan's JobConfig fields at 238fa99, section by section (data/tool_keys/torchtitan.json)."""
    from helpers.models import DATA_DIR

    return json.loads((DATA_DIR / "tool_keys" / "torchtitan.json").read_text())["sections"]


OLD_SECTIONS = {"float8", "mx"}          # the earlier generation's own tables (read as a whole)
OLD_KEYS = {old for spellings in ALIASES.values() for old in spellings[1:]} | {"optimizer.fused",
                                                                              "training.enable_loss_parallel"}


def check_fields(path: Path, data: dict) -> None:
    """ConfigError where torchtitan's ConfigManager refuses the file: a key its JobConfig lacks ('Invalid field
    names', config/manager.py _dict_to_dataclass, at every level), or a value it passes on as text where a bool or a
    number belongs (a quoted 'false' stays a string, which is true). A file of the earlier generation (one of its own
    keys, ALIASES' older spellings, or its [float8]/[mx] tables) is not checked: its config_manager.py (ccfc02be8871)
    merged the TOML into its argparse defaults and kept any key. With experimental.custom_args_module a job adds fields
    of its own (also [job] custom_config_module): not checked either."""

    if any(isinstance(data.get(section), dict) and data[section].get(key) for section, key in
           (("experimental", "custom_args_module"), ("job", "custom_config_module"))):
        return                    # (the job's own module adds fields, merged before the check: config/manager.py)
    if OLD_SECTIONS & set(data) or any(key in OLD_KEYS for key, _ in leaves(data)):
        return

    def walk(section: dict, fields: dict, prefix: str):
        for key, value in section.items():
            dotted = f"{prefix}.{key}" if prefix else str(key)
            kind = fields.get(key)
            if kind is None:
                near = did_you_mean(key, fields, 0.7, f"{prefix}." if prefix else "")
                extra = "" if near or prefix else (
                    f"; a job whose own config module adds [{key}] names it in the file as [job] "
                    f"custom_config_module (on the command line, --job.custom_config_module, it is not in the file "
                    f"and not read here)")
                raise ConfigError(path, f"{dotted} is not a torchtitan setting: its ConfigManager refuses the file "
                                        f"('Invalid field names', JobConfig @238fa99)" + (near or extra))
            if isinstance(kind, dict):
                if isinstance(value, dict):
                    walk(value, kind, dotted)
            elif kind == "bool" and isinstance(value, str):
                raise ConfigError(path, f"{dotted} must be true or false, got {value!r}: torchtitan passes text on "
                                        f"as it is, and any non-empty text is true")
            elif kind in ("int", "float", "float | int") and (isinstance(value, (str, bool)) or not isinstance(
                    value, (int, float))):
                raise ConfigError(path, f"{dotted} must be a number, got {value!r}")
    walk(data, job_config(), "")


def claims(path: Path, data) -> bool:
    """A TOML with one of torchtitan's main tables ([training], [model], [parallelism], [activation_checkpoint])."""
    return (Path(path).suffix.lower() == ".toml" and isinstance(data, dict)
            and bool(set(data) & {"training", "model", "parallelism", "activation_checkpoint"}))


class _Reader:
    def __init__(self, path: Path, data: dict, lines: dict):
        self.path, self.data, self.lines = Path(path), data, lines
        self.d = Record(NAME, path)
        self.used: set[str] = set()

    def find(self, key: str):
        """(the key as written, its value) of the first spelling present, or (None, torchtitan's default)."""
        for spelled in ALIASES.get(key, (key,)):
            value = get(self.data, spelled, _MISSING)
            if value is not _MISSING:
                self.used.add(spelled)
                return spelled, value
        return None, DEFAULTS.get(key)

    def line(self, key):
        return self.lines.get(key)

    def read(self) -> Imported:
        d, f = self.d, self.path
        for section in sorted(SECTIONS & set(self.data)):
            value = self.data[section]
            if not isinstance(value, dict):
                shape = "an array of tables ([[" + section + "]])" if isinstance(value, list) else repr(value)[:40]
                raise ConfigError(f, f"{section} must be a table ([{section}] with its settings below), as torchtitan's "
                                     f"JobConfig reads its sections, got {shape}")
        model, named = self.model()          # (a FLUX or VLM file is refused as such first: its job adds fields)
        self.catalogue_model = model
        check_fields(f, self.data)
        self.sizes()
        dp_rep, dp_shard, tp, cp, pp, ep, world = self.degrees()
        self.precision()
        self.strategy(dp_rep, dp_shard, tp, cp, pp, ep, world)
        self.checkpointing()
        self.optimizer()
        self.extras()
        d.default(TOOL, "model initialisation", "meta device", "github:pytorch/torchtitan torchtitan/train.py "
                  "@238fa9953e4a (the model built under torch.device('meta'), then to_empty and init_weights, or "
                  "checkpoint.load reading each rank's shards through torch.distributed.checkpoint)", sharded_load=True)
        d.default(TOOL, "attention", "sdpa (cuDNN/flash backends)", "github:pytorch/torchtitan "
                  "torchtitan/models/attention.py @238fa9953e4a (ScaledDotProductAttentionWrapper: cuDNN, flash, "
                  "math in that priority)", attention="flash")
        for key, value in leaves(self.data):
            if key not in self.used:
                d.ignored_at(f, self.line(key), key, value)
        return d.finish(model, named)

    def model(self):
        d, f = self.d, self.path
        kn, name = self.find("model.name")
        kf, flavour = self.find("model.flavor")
        for k, v, key in ((kn, name, "model.name"), (kf, flavour, "model.flavor")):
            if k is None:
                d.default(TOOL, key, v, SOURCE, sets="model")
            elif not isinstance(v, str):
                raise ConfigError(f, f"{key} must be a string, got {v!r}")
        if name in NOT_LANGUAGE:
            raise ConfigError(f, f"model.name {name!r} is torchtitan's {NOT_LANGUAGE[name]}, not a language model: this "
                                 f"package estimates decoder-only language-model training")
        model = FLAVOURS.get((name, flavour))
        if name == "llama" and flavour in ("8B", "70B"):          # 2024 files: model.name "llama3" or "llama"
            model = FLAVOURS[("llama3", flavour)]
        named = f"{name} {flavour}"
        for k, v in ((kn, name), (kf, flavour)):
            if k is not None:
                d.setting(f, self.line(k), k, v, sets=f"model={model!r}" if model else "model=None (not in the "
                          "catalogue: pass a config.json)")
        return model, named

    def sizes(self):
        d, f = self.d, self.path
        k, batch = self.find("training.local_batch_size")
        batch = positive_int(f, k or "training.local_batch_size", batch)
        if k:
            d.setting(f, self.line(k), k, batch, batch=batch)
        else:
            d.default(TOOL, "training.local_batch_size", batch, SOURCE, batch=batch)
        k, seq = self.find("training.seq_len")
        seq = positive_int(f, "training.seq_len", seq)
        (d.setting(f, self.line(k), k, seq, seq=seq) if k else
         d.default(TOOL, "training.seq_len", seq, SOURCE, seq=seq))
        self.batch = batch

    def degrees(self):
        d, f = self.d, self.path
        values = {}
        for key in ("parallelism.data_parallel_replicate_degree", "parallelism.data_parallel_shard_degree",
                    "parallelism.tensor_parallel_degree", "parallelism.context_parallel_degree",
                    "parallelism.pipeline_parallel_degree", "parallelism.expert_parallel_degree"):
            k, v = self.find(key)
            if v is None:
                v = 1
            values[key.split(".")[1]] = (k, positive_int(f, k or key, v, allow_minus_one=key.endswith("shard_degree")))
        dp_rep, dp_shard, tp, cp, pp, ep = (values[n][1] for n in (
            "data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
            "context_parallel_degree", "pipeline_parallel_degree", "expert_parallel_degree"))
        others = dp_rep * tp * cp * pp
        k_shard = values["data_parallel_shard_degree"][0]
        if dp_shard == -1:
            if NGPU_DEFAULT % others:
                raise ConfigError(f, f"data_parallel_shard_degree -1 takes the GPUs left of run_train.sh's NGPU "
                                     f"{NGPU_DEFAULT}, but the other degrees multiply to {others}, which does not "
                                     f"divide it: give data_parallel_shard_degree explicitly")
            dp_shard = NGPU_DEFAULT // others
            d.default("torchtitan run_train.sh @238fa99", "NGPU", NGPU_DEFAULT,
                      f"{RUN_SCRIPT}; data_parallel_shard_degree "
                      f"{'-1 in the file' if k_shard else 'defaults to -1'} takes the GPUs left: pass --gpus N if "
                      f"the run has another NGPU", sets=f"gpus={NGPU_DEFAULT}, data_parallel_shard_degree={dp_shard}")
        world = others * dp_shard
        for name, (k, v) in values.items():
            if k is None and name != "data_parallel_shard_degree":
                continue
            if name == "data_parallel_shard_degree":
                if k is not None:
                    d.setting(f, self.line(k), k, v, sets=f"data-parallel shard degree {dp_shard}")
            elif name == "data_parallel_replicate_degree":
                if v == 1 or dp_shard * cp == 1:                 # (HSDP's row is strategy()'s)
                    d.setting(f, self.line(k), k, v, sets=f"data-parallel replicate degree {v}")
            elif name == "tensor_parallel_degree":
                d.setting(f, self.line(k), k, v, tensor_parallel=v)
            elif name == "context_parallel_degree":
                d.setting(f, self.line(k), k, v, context_parallel=v)
            elif v > 1:
                d.unmodelled_at(f, self.line(k), k, v, f"{name.replace('_degree', '').replace('_', ' ')} is not "
                                                      f"modelled: each GPU holds a share of the layers"
                               if name.startswith("pipeline") else "expert parallelism is not modelled")
            else:
                d.setting(f, self.line(k), k, v, sets="off (as modelled)")
        return dp_rep, dp_shard, tp, cp, pp, ep, world

    def precision(self):
        d, f = self.d, self.path
        kd, dtype = self.find("training.dtype")
        km, param = self.find("training.mixed_precision_param")
        for k, v, allowed in ((kd, dtype, ("bfloat16", "float32")), (km, param, ("bfloat16", "float32"))):
            if v not in allowed:
                raise ConfigError(f, f"{k} must be one of {', '.join(allowed)}, got {v!r}")
        precision = "bf16" if dtype == "bfloat16" else ("bf16-mixed" if param == "bfloat16" else "fp32")
        if kd:
            d.setting(f, self.line(kd), kd, dtype, **({"precision": precision} if dtype == "bfloat16" else {}),
                      sets=None if dtype == "bfloat16" else "fp32 parameters and optimizer states")
        else:
            d.default(TOOL, "training.dtype", dtype, SOURCE, sets="fp32 parameters and optimizer states (bfloat16: "
                      "everything in bf16)")
        if dtype != "bfloat16":
            (d.setting(f, self.line(km), km, param, precision=precision) if km else
             d.default(TOOL, "training.mixed_precision_param", param, SOURCE, precision=precision))
        elif km:
            d.ignored_at(f, self.line(km), km, param)
        k, reduce = self.find("training.mixed_precision_reduce")
        if k:
            d.setting(f, self.line(k), k, reduce, sets="fp32 gradient reduction (as modelled)")

    def strategy(self, dp_rep, dp_shard, tp, cp, pp, ep, world):
        d, f = self.d, self.path
        gpus, hybrid = world, {}
        if dp_shard * cp > 1:
            strategy = "fsdp2"
            if dp_rep > 1:          # parallelize.py: fully_shard over the ('dp_replicate', 'dp_shard_cp') mesh
                hybrid = {"dp_replicate": dp_rep}
                d.setting(f, self.line("parallelism.data_parallel_replicate_degree"),
                          "parallelism.data_parallel_replicate_degree", dp_rep,
                          sets=f"dp_replicate={dp_rep} (HSDP: each of {dp_rep} groups shards over {dp_shard * cp} "
                               f"GPUs)")
        elif dp_rep > 1:
            strategy = "ddp"
        else:
            strategy = "single" if world == 1 else "ddp"
        d.setting(f, None, "parallelism (degrees)", {"dp_replicate": dp_rep, "dp_shard": dp_shard, "tp": tp, "cp": cp,
                                                     "pp": pp}, strategy=strategy, gpus=gpus, **hybrid)
        if strategy == "fsdp2":
            d.default(TOOL, "(training loop)", "reduce-scatter every micro batch",
                      "github:pytorch/torchtitan torchtitan/train.py @238fa9953e4a: each micro batch's backward runs "
                      "with gradient sync on (no no_sync), so sharded gradients accumulate", sync_each_batch=True)
        k, reshard = self.find("parallelism.fsdp_reshard_after_forward")
        if reshard not in ("default", "always", "never"):
            raise ConfigError(f, f"{k} must be default, always or never, got {reshard!r}")
        if k and reshard == "never" and strategy == "fsdp2":
            d.setting(f, self.line(k), k, reshard, reshard_after_forward=False,
                      sets="reshard_after_forward=False (every layer's gathered parameters kept from forward to "
                           "backward)")
        elif k:
            d.setting(f, self.line(k), k, reshard, sets="reshard after forward (as modelled)")
        k, offload = self.find("training.enable_cpu_offload")
        offload = boolean(f, "training.enable_cpu_offload", offload)
        if offload and strategy != "fsdp2":
            d.unmodelled_at(f, self.line(k), k, offload, "CPU offload applies to FSDP (data_parallel_shard_degree "
                                                        "> 1); here FSDP is not applied")
        elif k:
            d.setting(f, self.line(k), k, offload, offload_optimizer=offload, offload_params=offload)
        else:
            d.default(TOOL, "training.enable_cpu_offload", False, SOURCE, offload_optimizer=False,
                      offload_params=False)
        if offload and strategy == "fsdp2":
            d.default("torch CPUOffloadPolicy", "pin_memory", True, "torch.distributed.fsdp.CPUOffloadPolicy("
                      "pin_memory=True) as torchtitan builds it (torchtitan/models/llama3/infra/parallelize.py)",
                      pin_memory=True)
        k, global_batch = self.find("training.global_batch_size")
        if k:
            global_batch = positive_int(f, k, global_batch, allow_minus_one=True)
        dp = dp_rep * dp_shard
        if global_batch == -1:
            if k:
                d.setting(f, self.line(k), k, global_batch, grad_accum=1)
        else:
            per_step = self.batch * dp
            if global_batch % per_step:
                raise ConfigError(f, f"training.global_batch_size {global_batch} must be a multiple of "
                                     f"local_batch_size x data-parallel degree = {per_step}")
            d.setting(f, self.line(k), k, global_batch, grad_accum=global_batch // per_step)

    def checkpointing(self):
        d, f = self.d, self.path
        k, mode = self.find("activation_checkpoint.mode")
        ko, option = self.find("activation_checkpoint.selective_ac_option")
        if mode not in ("none", "full", "selective", "memory_budget"):
            raise ConfigError(f, f"activation_checkpoint.mode must be none, full, selective or memory_budget, "
                                 f"got {mode!r}")
        add = (lambda **kw: d.setting(f, self.line(k), k, mode, **kw)) if k else \
            (lambda **kw: d.default(TOOL, "activation_checkpoint.mode", mode, SOURCE, **kw))
        if mode == "none":
            add(checkpointing="none")
        elif mode == "full":
            add(checkpointing="full")
        elif mode == "memory_budget":
            add(checkpointing="none", sets="checkpointing='none' (an upper bound)")
            d.unmodelled_at(f, self.line(k), k or "activation_checkpoint.mode", mode,
                           "the compiler's memory-budget checkpointing is not modelled: estimated without "
                           "checkpointing")
        else:
            option = str(option)
            where = (lambda **kw: d.setting(f, self.line(ko), ko, option, **kw)) if ko else \
                (lambda **kw: d.default(TOOL, "activation_checkpoint.selective_ac_option", option, SOURCE, **kw))
            moe = self.moe_layers()
            if option == "op" and moe:
                add(checkpointing="none", sets="checkpointing='none' (an upper bound)")
                d.unmodelled_at(f, self.line(ko or k), ko or "activation_checkpoint.selective_ac_option", option,
                                f"per-op selective checkpointing is modelled for dense decoder layers; "
                                f"{self.catalogue_model} has {moe} mixture-of-experts layers: estimated without "
                                f"checkpointing (an upper bound)")
            elif option == "op":
                add(sets="selective: see selective_ac_option")
                where(checkpointing="selective")
            elif option.isascii() and option.isdigit() and int(option) == 1:
                add(sets="selective: see selective_ac_option")
                where(checkpointing="full", sets="checkpointing='full' (every layer)")
            elif option.isascii() and option.isdigit() and int(option) > 1:
                add(sets="selective: see selective_ac_option")
                where(checkpointing="full", checkpoint_every=int(option),
                      sets=f"checkpointing='full', checkpoint_every={int(option)} (every {int(option)}th layer)")
            else:
                raise ConfigError(f, f"activation_checkpoint.selective_ac_option must be 'op' or a positive integer "
                                     f"(every Nth layer), got {option!r}")

    def moe_layers(self) -> int:
        """The mixture-of-experts layers of the model the file names (0 where it is not in the catalogue)."""
        from helpers import models

        name = getattr(self, "catalogue_model", None)
        return models.spec(name).moe_layers if name else 0

    def optimizer(self):
        d, f = self.d, self.path
        k, name = self.find("optimizer.name")
        if name not in ("AdamW", "Adam"):          # components/optimizer.py build_optimizers: these two or an error
            raise ConfigError(f, f"{k or 'optimizer.name'} {name!r}: torchtitan builds Adam or AdamW only "
                                 f"('Optimizer {name} not added.', components/optimizer.py)"
                              + did_you_mean(name, ["Adam", "AdamW"], 0.6))
        elif k:
            d.setting(f, self.line(k), k, name, optimizer="adamw")
        old = get(self.data, "optimizer.fused", _MISSING)
        if old is not _MISSING:                                             # 2024: fused=True -> fused, else foreach
            self.used.add("optimizer.fused")
            impl = "fused" if boolean(f, "optimizer.fused", old) else "foreach"
            d.setting(f, self.line("optimizer.fused"), "optimizer.fused", old, adam_impl=impl)
            return
        k, impl = self.find("optimizer.implementation")
        if impl not in ("for-loop", "foreach", "fused"):
            raise ConfigError(f, f"optimizer.implementation must be for-loop, foreach or fused, got {impl!r}")
        (d.setting(f, self.line(k), k, impl, adam_impl=impl) if k else
         d.default(TOOL, "optimizer.implementation", impl, SOURCE, adam_impl=impl))
        k = "optimizer.early_step_in_backward"
        if get(self.data, k, False):
            self.used.add(k)
            d.unmodelled_at(f, self.line(k), k, True, "the optimizer step inside backward (gradients freed layer by "
                                                     "layer) is not modelled")

    def extras(self):
        d, f = self.d, self.path
        k, compiled = self.find("compile.enable")
        if compiled is not None:
            if boolean(f, k, compiled):
                d.unmodelled_at(f, self.line(k), k, compiled, "torch.compile's fusions change the saved activations: "
                                                             "not modelled (estimated eager)")
            else:
                d.setting(f, self.line(k), k, compiled, sets="eager (as modelled)")
        converters = get(self.data, "model.converters")
        if converters is not None:
            self.used.add("model.converters")
            if converters:
                d.unmodelled_at(f, self.line("model.converters"), "model.converters", converters,
                               "float8/MX linears (torchao) are not modelled")
            else:
                d.setting(f, self.line("model.converters"), "model.converters", converters, sets="none (as modelled)")
        if get(self.data, "float8.enable_float8_linear"):
            self.used.add("float8.enable_float8_linear")
            d.unmodelled_at(f, self.line("float8.enable_float8_linear"), "float8.enable_float8_linear", True,
                           "float8 linears (torchao) are not modelled")
        loss = get(self.data, "parallelism.disable_loss_parallel", get(self.data, "training.enable_loss_parallel"))
        for key in ("parallelism.disable_loss_parallel", "training.enable_loss_parallel"):
            if get(self.data, key) is not None:
                self.used.add(key)
                tp = self.d.fields.get("tensor_parallel", 1)
                d.setting(f, self.line(key), key, loss, sets="no effect without tensor parallelism" if tp == 1 else
                          "loss parallel (logits sharded over TP): not modelled apart")
        self.saves()

    def saves(self):
        """checkpoint.enable (checkpoint.enable_checkpoint before): torchtitan saves nothing unless it is true
        (JobConfig's Checkpoint: false); its CheckpointManager writes torch.distributed.checkpoint files, each rank
        its own shard under FSDP (sharded_save); an async mode stages the whole state dict on the host first."""
        d, f = self.d, self.path
        k, on = self.find("checkpoint.enable")
        on = boolean(f, k or "checkpoint.enable", on)
        if not on:
            add = ((lambda **kw: d.setting(f, self.line(k), k, on, **kw)) if k else
                   (lambda **kw: d.default(TOOL, "checkpoint.enable", False, SOURCE, **kw)))
            add(checkpoint_saves=False)
            return
        sharded = {"sharded_save": True} if self.d.fields.get("strategy") == "fsdp2" else {}
        d.setting(f, self.line(k), k, on, checkpoint_saves=True, **sharded)
        d.setting(f, self.line(k), k, on, sets="resume not added: torchtitan loads a checkpoint only if its folder "
                                               "holds one (pass resume to model the load)")
        km, mode = self.find("checkpoint.async_mode")
        if km and mode != "disabled":
            d.unmodelled_at(f, self.line(km), km, mode, "an async save stages the rank's whole state dict in host "
                                                        "memory first (pinned with async_with_pinned_mem): not "
                                                        "modelled, the real host figure is higher")
        elif km:
            d.setting(f, self.line(km), km, mode, sets="a synchronous save (as modelled)")


_MISSING = object()


def read(path: Path, data, lines: dict, given: list[Path]) -> Imported:
    """The set-up a torchtitan TOML describes (one file; a torchtitan run has no companion file)."""
    if not isinstance(data, dict):
        raise ConfigError(path, "not a torchtitan TOML: expected tables such as [training] and [parallelism]")
    unknown = sorted(set(data) - SECTIONS)
    if unknown and not (set(data) & {"training", "model"}):
        raise ConfigError(path, f"not a torchtitan TOML: unknown tables {', '.join(unknown)}")
    return _Reader(path, data, lines).read()
