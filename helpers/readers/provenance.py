"""One provenance record for every reader: the TrainSetup fields a config's values set, each with where it came from.

A reader fills one Record key by key: `setting` (a value of a file, at a line) or `set` (a key of the record's own
file, its line looked up), `default` (a key the files leave out and the tool's documented default), `unmodelled` /
`unmodelled_at` (it changes memory but is not modelled: listed, never dropped), `ignore` / `ignored_at` (no effect
on memory). Each Setting and Default carries the fields it set as a dict; its `sets` text is rendered from them unless
the reader says more. A companion file's record (a DeepSpeed JSON, an accelerate config) is taken in with `merge`.
`finish` validates the set-up, turning a bad combination into a one-line ConfigError naming the file.
`model_from` turns a name as a config writes it (a hub id, a path) into the catalogue's name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from helpers import models
from helpers.errors import InputError
from helpers.readers.base import (
    ConfigError,
    Default,
    Ignored,
    Imported,
    NotModelled,
    Setting,
    fp16_where_modelled,
    fused_ce_where_modelled,
    only_where_modelled,
)
from helpers.training import TrainSetup

GPUS_UNKNOWN_TOOL = "not in the files"
GPUS_UNKNOWN_SOURCE = ("the files do not say how many GPUs the run uses: 1 is assumed; pass --gpus N for the world "
                       "size")


def sets_text(fields: dict) -> str:
    """`batch=4, seq=2048`: what a setting sets, as Setting.sets writes it."""
    return ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in fields.items())


def model_from(named: str | None, referring: Path, key: str = "model") -> str | None:
    """The catalogue name of a hub id the catalogue knows, the path of a local config (a .json file or a directory
    holding config.json, as written or relative to the referring file), else None (the model is then only
    `model_named`). The same rules as the other readers: `helpers.readers.model_ref.resolve`."""
    from helpers.readers.model_ref import resolve

    return resolve(named, referring, key)[0] if named else None


class Record:
    """TrainSetup fields and their provenance, collected while one config (and its companions) is read."""

    def __init__(self, fmt: str, path, lines: dict[str, int] | None = None):
        self.format, self.path, self.lines = fmt, Path(path), dict(lines or {})
        self.fields: dict[str, Any] = {}
        self.settings: list[Setting] = []
        self.defaults: list[Default] = []
        self.not_modelled: list[NotModelled] = []
        self.ignored: list[Ignored] = []
        self.files: list[str] = [str(self.path)]
        self.world_unknown = False
        self.more_gpus = "ddp"
        self.per_world: dict | None = None
        self.engine_optimizer: str | None = None
        """The optimizer type a DeepSpeed JSON's `optimizer` block names (DeepSpeed then builds its own and a
        trainer's `optim` is not used); None: no block."""

    def setting(self, file, line, key: str, value, sets: str | None = None, **fields) -> None:
        """A value read from a file; `fields` are the TrainSetup fields it sets (none: it is read and keeps what is
        modelled anyway, `sets` says what)."""
        self.fields.update(fields)
        self.settings.append(Setting(str(file), line, key, value, sets if sets is not None else sets_text(fields),
                                     fields))

    def set(self, key: str, value, sets: str | None = None, **fields) -> None:
        """`setting` for a key of the record's own file, at the line the key is on."""
        self.setting(self.path, self.lines.get(key), key, value, sets, **fields)

    def default(self, tool: str, key: str, value, source: str, sets: str | None = None, **fields) -> None:
        """A key the files leave out and the tool's default that applies (`source`: where that default is written)."""
        self.fields.update(fields)
        self.defaults.append(Default(tool, key, value, sets if sets is not None else sets_text(fields), source,
                                     fields))

    def unmodelled_at(self, file, line, key: str, value, why: str) -> None:
        self.not_modelled.append(NotModelled(str(file), line, key, value, why))

    def unmodelled(self, key: str, value, why: str) -> None:
        """`unmodelled_at` for a key of the record's own file."""
        self.unmodelled_at(self.path, self.lines.get(key), key, value, why)

    def ignored_at(self, file, line, key: str, value) -> None:
        self.ignored.append(Ignored(str(file), line, key, value))

    def ignore(self, key: str, value) -> None:
        """`ignored_at` for a key of the record's own file."""
        self.ignored_at(self.path, self.lines.get(key), key, value)

    def merge(self, other: "Record") -> None:
        """Take in what a companion file's record set: its fields override ours, its entries follow ours."""
        self.fields.update(other.fields)
        self.settings += other.settings
        self.defaults += other.defaults
        self.not_modelled += other.not_modelled
        self.ignored += other.ignored
        self.engine_optimizer = other.engine_optimizer or self.engine_optimizer

    def integer(self, key: str, value, least: int = 1) -> int:
        """A whole number >= least, or a one-line ConfigError naming the file and the key."""
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(self.path, f"{key} must be an integer >= {least}, got {value!r}")
        return value

    def flag(self, key: str, value) -> bool:
        if not isinstance(value, bool):
            raise ConfigError(self.path, f"{key} must be true or false, got {value!r}")
        return value

    def gpus_unknown(self) -> None:
        """World size absent from the files: gpus=1 (or the tensor x context parallel degrees, in `finish`), said so."""
        self.default(GPUS_UNKNOWN_TOOL, "gpus", 1, GPUS_UNKNOWN_SOURCE, gpus=1)
        self.world_unknown = True

    def finish(self, model: str | None, model_named: str | None) -> Imported:
        """The Imported result; ConfigError (one line, naming the file) when the values read do not make a valid
        set-up together. No file said the world size: gpus=1, or the smallest world that holds the tensor x
        context parallel degrees, as a default that says so."""
        if "gpus" not in self.fields:
            self.gpus_unknown()
        self.not_modelled += only_where_modelled(self.fields, self.settings, self.defaults)
        self.not_modelled += fp16_where_modelled(self.fields, self.settings)
        self.not_modelled += fused_ce_where_modelled(self.fields, self.settings, self.defaults)
        tower = models.tower_note(model_named) if model else None
        if tower:
            at = next((s for s in self.settings if s.value == model_named), None)
            self.not_modelled.append(NotModelled(at.file if at else str(self.path), at.line if at else None,
                                                 at.key if at else "model", model_named, tower))
        degrees = self.fields.get("tensor_parallel", 1) * self.fields.get("context_parallel", 1)
        if self.world_unknown and degrees > 1:
            self.fields["gpus"] = degrees
            self.defaults = [d for d in self.defaults if d.key != "gpus"]
            self.default(GPUS_UNKNOWN_TOOL, "gpus", degrees, GPUS_UNKNOWN_SOURCE,
                         sets=f"gpus={degrees} (the tensor x context parallel degrees: one data-parallel rank)",
                         gpus=degrees)
        try:
            setup = TrainSetup(**self.fields).validate()
        except (InputError, TypeError) as e:
            raise ConfigError(self.path, f"its settings do not make a set-up this package models: {e}") from None
        return Imported(format=self.format, model=model, setup=setup, files=list(dict.fromkeys(self.files)),
                        settings=self.settings, defaults=self.defaults, not_modelled=self.not_modelled,
                        ignored=self.ignored, model_named=model_named, more_gpus=self.more_gpus,
                        per_world=self.per_world)


def positive_int(file, key: str, value, allow_minus_one: bool = False, argparse: bool = False) -> int:
    """`value` as a positive integer; ConfigError naming the file and key otherwise. `argparse`: a command-line value
    that argparse's type=int converts, which is Python's int() (any script's decimal digits too, '٤' is 4)."""
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?[0-9]+(_[0-9]+)*\s*", value):
        value = int(value)                     # as argparse's int and pydantic's lax int take it: +4, 1_6
    elif argparse and isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and not (allow_minus_one and value == -1)):
        allowed = "a positive integer" + (" or -1" if allow_minus_one else "")
        raise ConfigError(file, f"{key} must be {allowed}, got {value!r}")
    return value


def argparse_int(file, key: str, value, allow_minus_one: bool = False) -> int:
    """A command-line flag's value as argparse's type=int reads it (Python's int()), as a positive integer."""
    return positive_int(file, key, value, allow_minus_one, argparse=True)


TRUE_WORDS, FALSE_WORDS = ("true", "t", "yes", "y", "1"), ("false", "f", "no", "n", "0")


def boolean(file, key: str, value) -> bool:
    """`value` as a bool, as the tools' own parsers read a quoted one (pydantic's lax bool, transformers'
    `string_to_bool`: 'false', 'no', 'f', 'n', '0' are false, 'true', 'yes', 't', 'y', '1' true, in any case);
    ConfigError otherwise."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in TRUE_WORDS + FALSE_WORDS:
        return value.strip().lower() in TRUE_WORDS
    raise ConfigError(file, f"{key} must be true or false, got {value!r}")
