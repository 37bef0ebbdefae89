"""What the YAML readers (LLaMA-Factory, TRL, accelerate) share: the HF TrainingArguments keys they all take (batch,
accumulation, precision, optimizer) and their DeepSpeed companion, each recorded in the reader's provenance Record.

Sources: transformers (installed) `training_args.py` (TrainingArguments: per_device_train_batch_size 8,
gradient_accumulation_steps 1, bf16/fp16 False, optim "adamw_torch_fused" with torch >= 2.8, else "adamw_torch") and
`trainer.py` / `optimization` names (`OptimizerNames`: adamw_torch, adamw_torch_fused, adamw_bnb_8bit, adamw_8bit,
paged_adamw_8bit, ...).
"""

from __future__ import annotations

from pathlib import Path

from helpers.readers import base, hf_names
from helpers.readers.base import ConfigError, did_you_mean
from helpers.readers.provenance import Record


def transformers_default_optim() -> str:
    """TrainingArguments' default `optim` with the installed torch (adamw_torch_fused from torch 2.8 on)."""
    from transformers import TrainingArguments

    return str(getattr(TrainingArguments.__dataclass_fields__["optim"].default, "value",
                       TrainingArguments.__dataclass_fields__["optim"].default))




def optimizer(c: Record, key: str, value, strategy: str, origin: str | None = None) -> None:
    """transformers' `optim` name -> optimizer / adam_impl (`optimizer_effect`). origin: a default's tool, or None
    when the file sets it."""
    from helpers import strategies

    if not isinstance(value, str):
        raise ConfigError(c.path, f"{key} must be an optimizer name (e.g. adamw_torch), got {value!r}")
    changes, sets, notes = optimizer_effect(c, value, strategies.get(strategy))
    for why in notes:
        c.unmodelled(key, value, why)
    if changes is None:
        return
    if origin is None:
        c.set(key, value, sets, **changes)
    else:
        c.default(origin, key, value, "transformers/training_args.py TrainingArguments.optim", sets, **changes)


def optimizer_effect(c: Record, value: str, st) -> tuple[dict | None, str, list[str]]:
    """What the Trainer's `optim` `value` does to the set-up under strategy `st`: (the TrainSetup fields it sets, what
    that is in words, what is not modelled). Under ZeRO the Trainer's optimizer runs only where the DeepSpeed JSON has
    no `optimizer` block and offloads no optimizer (`trainer_optimizer_runs`); elsewhere DeepSpeed's own Adam does.
    An optimizer other than AdamW (and AdamW8bit where a strategy takes it) is not modelled: fields None."""
    from helpers import strategies

    runs, instead = trainer_optimizer_runs(c, st)
    name = value.lower()
    kind, impl = hf_names.OPTIMIZERS.get(name, (None, None))
    if kind is None or (runs and kind == "adamw-8bit" and not st.optimizer_8bit):
        own = "AdamW" if st.torch_optimizer else "DeepSpeed's own Adam"
        return None, "", [f"optimizer {value!r} is not modelled with strategy {st.name} (modelled: torch AdamW, and "
                          f"bitsandbytes' AdamW8bit with {strategies.listing(lambda x: x.optimizer_8bit)}); estimated "
                          f"as {own}"]
    if not runs:
        return {}, f"nothing: {instead}", []
    changes = {"optimizer": "adamw-8bit"} if kind == "adamw-8bit" else {"adam_impl": impl} if impl else {}
    sets = f"optimizer={kind}" + (f", adam_impl={impl}" if impl else "")
    if not st.torch_optimizer:
        sets += " (the Trainer hands it to DeepSpeed: the DeepSpeed config has no optimizer block)"
    return changes, sets, [hf_names.PAGED_WHY] if name in hf_names.PAGED else []


def trainer_optimizer_runs(c: Record, st) -> tuple[bool, str]:
    """(True, '') where the Trainer's own optimizer steps the run; under ZeRO (False, why not) where DeepSpeed's
    runs instead: an `optimizer` block in the DeepSpeed JSON (transformers `integrations/deepspeed.py`
    deepspeed_optim_sched then gives DeepSpeed a DummyOptim), or optimizer offload (accelerate swaps the Trainer's
    AdamW for DeepSpeedCPUAdam: `accelerate/utils/deepspeed.py` map_pytorch_optim_to_deepspeed)."""
    if st.torch_optimizer:
        return True, ""
    if c.engine_optimizer is not None:
        return False, (f"the DeepSpeed config's optimizer block ({c.engine_optimizer}) makes DeepSpeed build its own "
                       f"Adam; the Trainer's optim is not used")
    if c.fields.get("offload_optimizer"):
        return False, ("with offload_optimizer, accelerate swaps the Trainer's optimizer for DeepSpeedCPUAdam "
                       "(accelerate/utils/deepspeed.py map_pytorch_optim_to_deepspeed)")
    return True, ""


def take_optimizer(c: Record, take, strategy: str, origin: str) -> None:
    """The Trainer's `optim` key of a config (transformers' default, from `origin`, when the file leaves it out)."""
    optim = take("optim")
    if optim is None:
        optimizer(c, "optim", transformers_default_optim(), strategy, origin=origin)
    else:
        from transformers.training_args import OptimizerNames

        names = [o.value for o in OptimizerNames]
        if isinstance(optim, str) and optim not in names:       # TrainingArguments refuses it (an enum field)
            raise ConfigError(c.path, f"optim {optim!r} is not one of transformers' optimizers (TrainingArguments "
                                      f"refuses it: OptimizerNames)" + did_you_mean(optim, names))
        optimizer(c, "optim", optim, strategy)


def read_yaml_mapping(path: Path, data) -> dict:
    """The YAML's top-level mapping, or ConfigError naming the file."""
    if not isinstance(data, dict):
        raise ConfigError(path, f"expected a YAML mapping of option: value, got {type(data).__name__}")
    return data


def load_deepspeed(ds_path: Path, referring: Path, key: str):
    """The DeepSpeed JSON another file names: a JSON object (transformers and accelerate json.load it), else a
    one-line ConfigError naming both files."""
    try:
        data, lines = base.load_json(ds_path)
    except ConfigError as e:
        raise ConfigError(ds_path, f"{e.problem} (it is the DeepSpeed config that {Path(referring).name}'s {key} "
                                   f"names)") from None
    if not isinstance(data, dict):
        raise ConfigError(ds_path, f"a DeepSpeed config must be a JSON object, got {type(data).__name__} (it is the "
                                   f"DeepSpeed config that {Path(referring).name}'s {key} names)")
    return data, lines


def companion_deepspeed(c: Record, ref, given: list[Path], trainer: dict, hidden: int | None, key: str = "deepspeed"):
    """Read the DeepSpeed JSON that `key` names (relative to the file, then among the given files) and merge it."""
    from helpers.readers import deepspeed

    if not isinstance(ref, str):
        raise ConfigError(c.path, f"{key} must be the path of a DeepSpeed JSON, got {ref!r}")
    ds_path = base.companion(ref, c.path, given, what="DeepSpeed config")
    c.set(key, ref, f"the DeepSpeed config {ds_path.name} (read below)")
    data, lines = load_deepspeed(ds_path, c.path, key)
    c.files.append(str(ds_path))
    c.merge(deepspeed.apply(ds_path, data, lines, trainer, hidden))
    return ds_path


def trainer_sizes(c: Record, take, name: str) -> dict:
    """per_device_train_batch_size and gradient_accumulation_steps of an HF-Trainer YAML (LLaMA-Factory, TRL), or
    TrainingArguments' defaults: set on `c`, and returned as the trainer values a DeepSpeed "auto" resolves to
    ({key: (value, where it came from)})."""
    from helpers.readers.deepspeed import HF_DEFAULTS, transformers_tool

    hf = transformers_tool()
    trainer: dict = {}
    for key, field_ in (("per_device_train_batch_size", "batch"), ("gradient_accumulation_steps", "grad_accum")):
        value = take(key)
        if value is None:
            value = HF_DEFAULTS[key]
            c.default(hf, key, value, "transformers/training_args.py TrainingArguments", f"{field_}={value}",
                      **{field_: value})
            trainer[key] = (value, f"{hf} default")
        else:
            c.set(key, value, f"{field_}={c.integer(key, value)}", **{field_: value})
            trainer[key] = (value, f"{name} line {c.lines.get(key)}")
    return trainer


def taker(data: dict):
    """`take(key, default)` reading `data` and noting each key read in `done`, so a reader can list the rest as
    ignored: (take, done)."""
    done: set[str] = set()

    def take(key, default=None):
        done.add(key)
        return data.get(key, default)

    return take, done


def misspelt(key: str, done: set[str]) -> str | None:
    """The key a reader looks for that `key` looks like a misspelling of (difflib ratio >= 0.88), whether or not the
    file gives that key too, when `key` is no field of transformers' TrainingArguments; else None. TRL's parser and
    LLaMA-Factory's (HfArgumentParser, allow_extra_keys False) refuse a key their argument classes do not have, so a
    misspelt memory setting never trains at its default: the reader refuses it too, instead of listing it as ignored."""
    import dataclasses
    import difflib

    from transformers import TrainingArguments

    if key in {f.name for f in dataclasses.fields(TrainingArguments)}:
        return None
    near = difflib.get_close_matches(key, sorted(done), n=1, cutoff=0.88)       # (given beside it too: a duplicate)
    return near[0] if near else None


EVALUATION = {
    "do_eval": "evaluation runs forward passes outside the training step (with compute_metrics and no "
               "eval_accumulation_steps the Trainer keeps every evaluation batch's logits on the GPU until it ends: "
               "TrainingArguments' docs): the real figure is higher while it runs",
    "do_predict": "prediction runs forward passes outside the training step (with predict_with_generate, generation "
                  "and its KV cache): the real figure is higher while it runs",
    "predict_with_generate": "generation during evaluation or prediction (a KV cache per sequence): the real figure "
                             "is higher while it runs",
}
EVALUATION["eval_strategy"] = EVALUATION["evaluation_strategy"] = EVALUATION["do_eval"]


def evaluation(c, key: str, value) -> bool:
    """A TrainingArguments switch that runs evaluation or prediction beside training: listed as not modelled when it
    turns one on (the real figure is higher while it runs), ignored when off; False for any other key."""
    if key not in EVALUATION:
        return False
    text = str(value).strip().lower()
    on = text not in ("no", "none", "false", "0", "") if key.endswith("strategy") else text in ("true", "1")
    if on:
        c.unmodelled(key, value, EVALUATION[key])
    else:
        c.ignore(key, value)
    return True


def saves(c, key: str, value, line: int | None = None) -> bool:
    """TrainingArguments' save_strategy: "no" saves no checkpoint (checkpoint_saves False); steps, epoch or best save
    one after an optimizer step, as the estimate counts by default (transformers 5.23 training_args.py:
    SaveStrategy, default "steps"); one line for anything else. False for any other key. `line`: where the key is,
    for a record that does not keep its file's lines."""
    if key != "save_strategy":
        return False
    text = str(value).strip().lower()
    if text not in ("no", "steps", "epoch", "best"):
        bare = " (YAML reads a bare no as false: write \"no\")" if value is False else ""
        raise ConfigError(c.path, f"save_strategy must be no, steps, epoch or best (transformers' SaveStrategy), "
                                  f"got {value!r}{bare}")
    at = line if line is not None else c.lines.get(key)
    if text == "no":
        c.setting(c.path, at, key, value, "checkpoint_saves=False", checkpoint_saves=False)
    else:
        c.setting(c.path, at, key, value, "checkpoint_saves: a save counted after a step", checkpoint_saves=True)
    return True


def refuse_misspelt(path, key: str, done: set[str], tool: str) -> None:
    """ConfigError naming `key` and what it looks like (see `misspelt`), when it looks like one."""
    near = misspelt(key, done)
    if near is not None:
        raise ConfigError(path, f"unknown key {key!r}: did you mean {near!r}? ({tool} refuses keys its arguments do "
                                f"not have; fix the spelling)")


class TrainerYaml:
    """A reader of an HF-Trainer YAML (LLaMA-Factory, TRL): its keys taken one topic method at a time, in TOPICS
    order, into one provenance Record; `default` records the tool's own default of a key."""

    NAME = TOOL = SRC = ""
    TOPICS: tuple[str, ...] = ()

    def __init__(self, path, data, lines: dict[str, int], given: list[Path]):
        from helpers.readers.deepspeed import transformers_tool

        self.path, self.lines, self.given = Path(path), lines, given
        self.data = read_yaml_mapping(path, data)
        self.c = Record(self.NAME, path, lines)
        self.take, self.done = taker(self.data)
        self.hf = transformers_tool()
        self.model = self.named = None

    def read(self):
        for topic in self.TOPICS:
            getattr(self, topic)()
        return self.c.finish(self.model, self.named)

    def default(self, key, value, sets, file, **changes):
        """The tool's own default of `key` (at the version in TOOL), from `file` under SRC."""
        self.c.default(self.TOOL, key, value, self.SRC + file, sets, **changes)

    def value_or_default(self, key: str, value, field: str, default, file: str, parse) -> None:
        """`key`'s value (checked by `parse(key, value)`) setting `field`, or the tool's default from `file` where
        the config leaves it out."""
        if value is None:
            self.default(key, default, f"{field}={default}", file, **{field: default})
        else:
            v = parse(key, value)
            self.c.set(key, value, f"{field}={v}", **{field: v})
