"""The six cases: each one's model, reported set-up, fix and reported figures, read from data/cases.json."""

from __future__ import annotations

import functools
import json

from helpers.errors import InputError
from helpers.models import DATA_DIR
from helpers.training import TrainSetup
from helpers.units import GB, GiB

UNITS = {"GB": GB, "GiB": GiB, "TB": 1000 * GB}


@functools.lru_cache(maxsize=1)
def _all() -> dict:
    return json.loads((DATA_DIR / "cases.json").read_text())["cases"]


def case(number: int | str) -> dict:
    """One case's record; InputError for an unknown number."""
    cases = _all()
    if str(number) not in cases:
        raise InputError(f"unknown case {number!r}: cases are {', '.join(cases)}")
    return cases[str(number)]


def setup(number: int | str, fixed: bool = False, **changes) -> TrainSetup:
    """The case's reported set-up (with its fix applied when `fixed`), plus any changes."""
    c = case(number)
    fields = {**c["setup"], **(c["fix"] if fixed else {}), **changes}
    return TrainSetup(**fields).validate()


def reported_bytes(item: dict) -> float:
    """A reported figure in bytes, read in the unit the project reads it as ('read_as')."""
    return item["value"] * UNITS[item["read_as"]]
