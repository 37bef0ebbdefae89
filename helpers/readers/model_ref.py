"""The model a config file names (`model_name_or_path: ...`): a catalogue name, a local config, or neither.

A hub id the catalogue knows (`helpers.models.hub_ids()`) becomes its catalogue name; a local path to a config.json or
to a model directory (tried as written, then relative to the file that names it) becomes that path; another hub id is
looked up in the local Hugging Face cache (and downloaded where the command line allows it: helpers.hub); what is
found nowhere is kept only as `model_named` (model None), and the command line asks for --model.
"""

from __future__ import annotations

import contextvars
from pathlib import Path

from helpers import models
from helpers.errors import InputError
from helpers.readers.base import ConfigError


def resolve(named, referring: Path, key: str = "model_name_or_path") -> tuple[str | None, str | None]:
    """(model for the estimator or None, the model as the file names it). ConfigError when the value is not a string,
    or looks like a local path (starts with '/', './', '../' or '~', or ends in .json) that holds no model config and
    no model is named beside the files (--model: a path on the machine the run was on is then only the file's name)."""
    if named is None:
        return None, None
    if not isinstance(named, str) or not named.strip():
        raise ConfigError(referring, f"{key} must be a hub id or a path, got {named!r}")
    text = named.strip()
    if text in models.catalogue():
        return text, text
    if text.lower() in models.hub_ids():
        return models.hub_ids()[text.lower()], text
    for candidate in (Path(text).expanduser(), Path(referring).parent / text):
        config = candidate / "config.json" if candidate.is_dir() else candidate
        if config.suffix == ".json" and config.is_file():
            try:
                models.read_config_dict(config)
            except InputError as e:
                raise ConfigError(referring, f"{key} {text!r}: {e}") from None
            return str(config), text
    if models._HUB_ID_RE.match(text) and not Path(text).exists():
        from helpers import hub

        try:
            found = hub.config_file(text)       # the Hugging Face cache; a download where the command line allows it
        except InputError:                      # (not reachable, gated, ...: the file still reads; --model may say)
            found = None
        if found is not None:
            return str(found), text
    if (text.startswith(("/", "./", "../", "~")) or text.endswith(".json")) and MODEL_GIVEN.get() is None:
        raise ConfigError(referring, f"{key} {text!r} is a path with no model config.json there: give a hub id the "
                                     f"catalogue knows (python -m helpers models) or a local config.json, or name the "
                                     f"model beside the file (--model NAME_OR_HUB_ID)")
    return None, text


MODEL_GIVEN: contextvars.ContextVar = contextvars.ContextVar("model_given", default=None)
"""The model the user names beside the files (--model), which replaces the files' own: `readers.read` sets it."""


def sets_words(model: str | None, unresolved: str = "not in the catalogue: pass --model or a config.json") -> str:
    """What a file's model setting sets, in words: 'model=NAME'; where the file's model is not resolved, the model
    named beside the files (--model) when there is one, else `unresolved` (why not, and what to do)."""
    if model:
        return f"model={model!r}"
    given = MODEL_GIVEN.get()
    return f"replaced by --model {given}" if given else f"model=None ({unresolved})"


def hidden_size(model: str | None) -> int | None:
    """The hidden size of the model the run trains (what transformers' DeepSpeed integration sizes its "auto" buckets
    by): the model named beside the files when there is one, else the files' own; None without a model."""
    model = MODEL_GIVEN.get() or model
    if model is None:
        return None
    return models.spec(model).hidden


def module_names(targets: list[str], model: str | None) -> list[str]:
    """Projections named as Llama names them (q_proj, ..., gate_proj, up_proj) in the model's own module names: a model
    with one fused qkv_proj (gate_up_proj, as Phi-3) has its q, k, v (gate, up) adapters there; LitGPT's
    LoRAQKVLinear and torchtune's phi3 builders likewise adapt their fused linear."""
    if model is None:
        return targets
    names = set(models.spec(model).linear_names())
    out = []
    for t in ",".join(targets).split(","):
        if t not in names and t in ("q_proj", "k_proj", "v_proj") and "qkv_proj" in names:
            t = "qkv_proj"
        elif t not in names and t in ("gate_proj", "up_proj") and "gate_up_proj" in names:
            t = "gate_up_proj"
        if t not in out:
            out.append(t)
    return out
