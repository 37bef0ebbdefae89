"""Readers of the reader's own training config: `read(["run.yaml", "ds_z3.json"])` -> Imported (model, TrainSetup,
and where every memory-relevant value came from). One module per format; `base` holds the shared result.

Each reader module defines NAME, `claims(path, data) -> bool` (the file looks like its tool's) and
`read(path, data, lines, given) -> Imported` (`given`: every file passed, so it can find companions by name).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from helpers.errors import InputError
from helpers.readers.base import ConfigError, Default, Ignored, Imported, NotModelled, Setting, companion

__all__ = ["read", "ConfigError", "Imported", "Setting", "Default", "NotModelled", "Ignored", "companion", "FORMATS"]

# Asked in this order which of them a file belongs to; DeepSpeed JSON last: it is mostly a companion of another.
FORMATS = ("torchtitan", "torchtune", "litgpt", "openrlhf", "axolotl", "llamafactory", "trl", "accelerate", "deepspeed")


def _reader(name: str):
    return importlib.import_module(f"helpers.readers.{name}")


def load(path: Path):
    """The parsed file and its key lines, by suffix: .json, .yaml/.yml, .toml; anything else is read as text (a
    command line or a shell script)."""
    from helpers.readers import base

    suffix = path.suffix.lower()
    if suffix == ".json":
        return base.load_json(path)
    if suffix in (".yaml", ".yml"):
        return base.load_yaml(path)
    if suffix == ".toml":
        return base.load_toml(path)
    return base._text(path), {}


# keys that say which tool a file is for (what each reader's `claims` looks for)
IDENTIFYING = {"base_model": "axolotl", "model_name_or_path": "LLaMA-Factory or TRL", "checkpoint_dir": "LitGPT",
               "zero_optimization": "DeepSpeed", "train_micro_batch_size_per_gpu": "DeepSpeed",
               "distributed_type": "accelerate", "compute_environment": "accelerate", "training": "torchtitan"}


def _near_identifying_key(data) -> str | None:
    """'base-model looks like base_model (axolotl)' where a top-level key is a near miss of a key that identifies a
    format; None otherwise."""
    import difflib

    if not isinstance(data, dict):
        return None
    for key in data:
        near = difflib.get_close_matches(str(key), list(IDENTIFYING), n=1, cutoff=0.8)
        if near and near[0] != key:
            return f"{key} looks like {near[0]} ({IDENTIFYING[near[0]]})"
    return None


def detect(path: Path, data) -> str:
    """Which format a file is in; ConfigError naming the formats if none claims it."""
    if path.suffix.lower() in (".json", ".yaml", ".yml", ".toml") and not isinstance(data, dict):
        what = "empty" if data is None or data == "" else f"a {type(data).__name__} ({str(data)[:40]!r})"
        raise ConfigError(path, f"is {what}, not a mapping of option: value as every training config is")
    for name in FORMATS:
        try:
            reader = _reader(name)
        except ModuleNotFoundError:
            continue
        if reader.claims(path, data):
            return name
    near = _near_identifying_key(data)
    raise ConfigError(path, (f"{near}; " if near else "") +
                      f"not a config this package reads: expected one of {', '.join(FORMATS)} "
                            f"(a DeepSpeed JSON, an axolotl, LLaMA-Factory, torchtune or LitGPT YAML, a torchtitan TOML, "
                            f"an OpenRLHF command line or .sh script, a TRL or accelerate YAML)")


def read(paths, model: str | None = None) -> Imported:
    """Read one run's config files (`model`: the model named beside them, which replaces theirs: sizes the files
    derive from the model, DeepSpeed's "auto" buckets, follow it). The first file that is not a companion of another (a DeepSpeed JSON given with an
    axolotl YAML is its companion; an accelerate YAML given with a TRL YAML is the TRL run's launcher config) is read;
    every other file must be one it refers to or takes, else ConfigError."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    if not isinstance(paths, (list, tuple)) or not all(isinstance(p, (str, Path)) for p in paths):
        raise InputError(f"read needs config file paths (a str or Path, or a list of them), got {paths!r:.80}")
    if any(not str(p).strip() for p in paths):
        raise InputError("an empty file name was given: name a config file (e.g. --from run.yaml)")
    paths = [Path(p) for p in paths]
    if not paths:
        raise InputError("read needs at least one config file")
    if model is not None and (not isinstance(model, (str, Path)) or not str(model).strip()):
        raise InputError(f"model must be a catalogue name, a hub id or a config.json path, got {model!r:.80}")
    from helpers.readers import model_ref

    token = model_ref.MODEL_GIVEN.set(model)
    try:
        return _read(paths)
    finally:
        model_ref.MODEL_GIVEN.reset(token)


def _read(paths: list[Path]) -> Imported:
    loaded = {p: _guarded(p, load, p) for p in paths}
    kinds = {p: _guarded(p, detect, p, loaded[p][0]) for p in paths}
    # The run's own config first: a DeepSpeed JSON or an accelerate YAML is the companion of the training config
    # given with it (a TRL YAML takes every given accelerate YAML as its launcher's config), in either order.
    primary = next((p for p in paths if kinds[p] not in ("deepspeed", "accelerate")),
                   next((p for p in paths if kinds[p] != "deepspeed"), paths[0]))
    data, lines = loaded[primary]
    imported = _guarded(primary, _reader(kinds[primary]).read, primary, data, lines, paths)
    used = {Path(f).resolve() for f in imported.files}
    for p in paths:
        if p.resolve() not in used:
            raise ConfigError(p, f"given, but {primary} does not refer to it ({kinds[p]} format); give the files of "
                                 f"one run")
    return imported





def _guarded(path: Path, fn, *args):
    """fn(*args), with a value of a type no reader expected (a list where a name belongs, a nesting too deep) turned
    into a one-line ConfigError naming the file: a hostile or mistyped config never ends in a traceback. Readers check
    their values themselves; this is the last guard, and its message says which Python error it stands for."""
    try:
        return fn(*args)
    except InputError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError, RecursionError) as e:
        detail = " ".join(str(e).split())[:200]
        raise ConfigError(path, f"a value of an unexpected type or size ({type(e).__name__}: {detail})") from None
