"""A reader's result while it is being read: the TrainSetup fields chosen so far and, beside each, where it came from.

The axolotl, torchtitan and OpenRLHF readers fill one Draft key by key (`setting`, `default`, `not_modelled`,
`ignored`) and end with `finish`, which validates the set-up and turns a bad combination into a one-line ConfigError
naming the file. `model_from` turns a name as a config writes it (a hub id, a path) into the catalogue's name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers.errors import InputError
from helpers.readers.base import ConfigError, Default, Ignored, Imported, NotModelled, Setting, only_where_modelled
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


class Draft:
    """TrainSetup fields and their provenance, collected while one config is read."""

    def __init__(self, fmt: str, primary: Path):
        self.format, self.primary = fmt, Path(primary)
        self.fields: dict[str, Any] = {}
        self.settings: list[Setting] = []
        self.defaults: list[Default] = []
        self.not_modelled_: list[NotModelled] = []
        self.ignored_: list[Ignored] = []
        self.files: list[str] = [str(primary)]

    def setting(self, file, line, key: str, value, sets: str | None = None, **fields) -> None:
        """A value read from a file; `fields` are the TrainSetup fields it sets (none: it is read and keeps what is
        modelled anyway, `sets` says what)."""
        self.fields.update(fields)
        self.settings.append(Setting(str(file), line, key, value, sets if sets is not None else sets_text(fields),
                                     fields))

    def default(self, tool: str, key: str, value, source: str, sets: str | None = None, **fields) -> None:
        """A key the files leave out and the tool's default that applies."""
        self.fields.update(fields)
        self.defaults.append(Default(tool, key, value, sets if sets is not None else sets_text(fields), source,
                                     fields))

    def not_modelled(self, file, line, key: str, value, why: str) -> None:
        self.not_modelled_.append(NotModelled(str(file), line, key, value, why))

    def ignored(self, file, line, key: str, value) -> None:
        self.ignored_.append(Ignored(str(file), line, key, value))

    def gpus_unknown(self) -> None:
        """World size absent from the files: gpus=1 (or the tensor x context parallel degrees, in `finish`), said so."""
        self.default(GPUS_UNKNOWN_TOOL, "gpus", 1, GPUS_UNKNOWN_SOURCE, gpus=1)
        self._gpus_unknown = True

    def finish(self, model: str | None, model_named: str | None) -> Imported:
        """The Imported result; ConfigError (one line, naming the primary file) when the values read do not make a
        valid set-up together."""
        self._model_parallel_only_where_modelled()
        try:
            setup = TrainSetup(**self.fields).validate()
        except (InputError, TypeError) as e:
            raise ConfigError(self.primary, f"its settings do not make a set-up this package models: {e}") from None
        files = list(dict.fromkeys(self.files))
        return Imported(format=self.format, model=model, setup=setup, files=files, settings=self.settings,
                        defaults=self.defaults, not_modelled=self.not_modelled_, ignored=self.ignored_,
                        model_named=model_named)


    def _model_parallel_only_where_modelled(self) -> None:
        """Settings modelled with some strategies only (tensor/context parallel, a 4-bit base) listed as not
        modelled under the others (base.only_where_modelled); an unknown world size made the tp x cp degrees."""
        self.not_modelled_ += only_where_modelled(self.fields, self.settings)
        degrees = self.fields.get("tensor_parallel", 1) * self.fields.get("context_parallel", 1)
        if getattr(self, "_gpus_unknown", False) and degrees > 1:     # the smallest world that holds the degrees
            self.fields["gpus"] = degrees
            self.defaults = [d for d in self.defaults if d.key != "gpus"]
            self.default(GPUS_UNKNOWN_TOOL, "gpus", degrees, GPUS_UNKNOWN_SOURCE,
                         sets=f"gpus={degrees} (the tensor x context parallel degrees: one data-parallel rank)",
                         gpus=degrees)


def positive_int(file, key: str, value, allow_minus_one: bool = False) -> int:
    """`value` as a positive integer; ConfigError naming the file and key otherwise."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and not (allow_minus_one and value == -1)):
        allowed = "a positive integer" + (" or -1" if allow_minus_one else "")
        raise ConfigError(file, f"{key} must be {allowed}, got {value!r}")
    return value


def boolean(file, key: str, value) -> bool:
    """`value` as a bool (YAML/TOML true/false, or the strings 'true'/'false'); ConfigError otherwise."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ConfigError(file, f"{key} must be true or false, got {value!r}")
