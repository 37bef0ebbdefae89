"""The cases: each one's model, reported set-up, fix and reported figures, read from data/cases.json (cases 1-6 from a
write-up and the upstream thread it summarises, case 7 from its upstream thread alone)."""

from __future__ import annotations

import functools
import json

from helpers.errors import InputError
from helpers.models import DATA_DIR
from helpers.training import TrainSetup
from helpers.units import GB, GiB

UNITS = {"GB": GB, "GiB": GiB, "TB": 1000 * GB}


@functools.lru_cache(maxsize=1)
def _document() -> dict:
    return json.loads((DATA_DIR / "cases.json").read_text())


def _all() -> dict:
    return _document()["cases"]


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


def checklist() -> list[dict]:
    """Symptom -> cause -> notebook -> ways out, one row per case, with the OOM the case's estimate must show and
    whether the row's fix must fit (read from data/cases.json)."""
    return _document()["checklist"]


def citation(number: int | str) -> str:
    """The case's sources in one line of plain ASCII (figure titles have no CJK font): upstream issue(s), write-up
    (where there is one)."""
    src = case(number)["source"]
    upstream = "; ".join(u["short"] for u in src["upstream"])
    w = src.get("write_up")
    return f"{upstream}; write-up by {w['author_latin']}, {w['published']}, {w['date']}" if w else upstream


def sources_markdown(number: int | str) -> str:
    """The case's sources as a Markdown list with links: the write-up where there is one (title in its language, with
    a gloss), the upstream threads, and the docs or code it rests on."""
    src = case(number)["source"]
    w = src.get("write_up")
    lines = [f"- Write-up: {w['author']}, [{w['title']}]({w['url']}) (\"{w['title_en']}\"), {w['published']}, "
             f"{w['date']} (in Chinese)"] if w else []
    lines += [f"- Upstream: [{u['what']}]({u['url']})" for u in src["upstream"]]
    lines += [f"- Docs and code: [{u['what']}]({u['url']})" for u in src["docs"]]
    return "\n".join(lines)


def reported_lines(number: int | str) -> str:
    """The case's reported figures as readable lines: what, the figure as written, how it is read and why."""
    lines = []
    for r in case(number)["reported"]:
        where = {"reported": "as reported", "fixed": "with the fix", "machine": "the machine",
                 "benchmark": "a published benchmark", "other set-up": "another set-up"}.get(r.get("applies_to"), "")
        if r["value"] is None:
            lines.append(f"  reported ({where}): {r['what']}")
            continue
        value = " -> ".join(map(str, r["value"])) if isinstance(r["value"], list) else str(r["value"])
        lines.append(f"  reported ({where}): {r['what']}: {value} {r['unit']}, read as {r['read_as']} ({r['why']})")
    return "\n".join(lines)


def reported_bytes(item: dict) -> float:
    """A reported figure in bytes, read in the unit the project reads it as ('read_as')."""
    return item["value"] * UNITS[item["read_as"]]
