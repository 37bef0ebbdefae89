"""One provenance record: each Setting and Default says, as a dict, which TrainSetup fields it set; the text `sets` is
for people, and nothing parses it back (the CLI's overrides, the partly-modelled rule and notebook 07 read `fields`)."""

import dataclasses
from pathlib import Path

import pytest

from helpers import readers
from helpers.__main__ import _origin
from helpers.errors import InputError
from helpers.training import TrainSetup

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = sorted(p for p in (ROOT / "tests" / "data" / "configs_upstream").rglob("*")
                  if p.is_file() and p.suffix in (".json", ".yaml", ".yml", ".toml", ".sh"))
CASES = [[ROOT / "data" / "configs" / name] for name in (
    "case1_openrlhf_sft.sh", "case2_openrlhf_sft.sh", "case3_openrlhf_sft.sh", "case5_torchtitan.toml")] + [
    [ROOT / "data" / "configs" / "case4_axolotl.yaml"], [ROOT / "data" / "configs" / "case6_llamafactory.yaml"]]


def _read(files):
    try:
        return readers.read([str(f) for f in files])
    except InputError as exc:                      # an upstream file this package refuses, with its one line
        pytest.skip(str(exc))


@pytest.mark.parametrize("files", CASES + [[p] for p in UPSTREAM], ids=lambda f: Path(f[0]).name)
def test_every_field_a_file_changes_has_a_setting_or_default_that_says_so(files):
    imp = _read(files)
    named = {k for x in imp.settings + imp.defaults for k in x.fields}
    differs = {f.name for f in dataclasses.fields(TrainSetup) if getattr(imp.setup, f.name) != f.default}
    assert differs <= named, differs - named
    for x in imp.settings + imp.defaults:
        assert isinstance(x.fields, dict) and set(x.fields) <= {f.name for f in dataclasses.fields(TrainSetup)}
        for name, value in x.fields.items():          # the text names what the dict holds
            assert name in x.sets, (x.key, x.sets, x.fields)


def test_the_origin_of_a_field_is_found_by_its_fields_not_its_text():
    imp = _read([ROOT / "data" / "configs" / "case6_llamafactory.yaml"])
    s = next(x for x in imp.settings if "seq" in x.fields)
    assert _origin(imp, "seq") == f"{s.file}:{s.line} ({s.key})"
    d = next(x for x in imp.defaults if x.fields)
    field = next(iter(d.fields))
    if not any(field in x.fields for x in imp.settings):
        assert _origin(imp, field) == f"default ({d.tool}: {d.key})"
    assert _origin(imp, "resume").startswith("this package's default")
