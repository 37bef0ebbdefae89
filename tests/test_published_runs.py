"""Published training runs beside ours (data/published.json 'peaks', helpers.published_runs): the rows read as their
sources print them, and the recorded comparison (data/results/published_vs_ours.json, written by
`python -m helpers.bench published`) is what the code gives now. Nothing here asserts how close a figure lands: the
comparison is a finding, recorded with what the published runs do that the set-ups do not express."""

import json
from pathlib import Path

import pytest

from helpers import estimate, models, published, published_runs
from helpers.errors import InputError
from helpers.units import GB, GiB

RECORD = Path(__file__).resolve().parent.parent / "data" / "results" / published_runs.RESULTS_FILE


def test_rows_are_in_their_published_units_with_sources():
    rows = {r["id"]: r for r in published.peaks()}
    tt, lit = rows["torchtitan-llama3.1-8b-fsdp8"], rows["litgpt-tinyllama-full"]
    assert tt["bytes"] == round(82.4 * GiB) and tt["view"] == "reserved"          # torchtitan logs GiB, reserved
    assert lit["bytes"] == round(14.10 * GB) and lit["view"] == "allocated"       # LitGPT prints GB, allocated
    peft = rows["peft-metamathqa-llama3.2-3b-lora-r32"]
    assert peft["bytes"] == 22_292_725_760 and peft["view"] == "reserved"         # PEFT's result files: bytes, reserved
    assert published_runs.setup(peft).adapters_fp32                              # autocast_adapter_dtype true
    for row in rows.values():
        assert row["model"] in models.catalogue() or row["model_file"].startswith("data/published_models/")
        assert row["url"].startswith("https://github.com/")
        assert row["not_modelled"] and row["source"] and row["settings"]
        published_runs.setup(row)                                                  # a valid TrainSetup
    s = published_runs.setup(lit)
    assert (s.batch, s.seq, s.grad_accum, s.precision, s.strategy) == (4, 512, 8, "bf16", "single")
    s = published_runs.setup(tt)
    assert (s.gpus, s.batch, s.seq, s.checkpointing, s.precision, s.adam) == (8, 2, 8192, "selective", "bf16-mixed", "foreach")


def test_unknown_run_is_named():
    with pytest.raises(InputError, match="no published peak 'nope': known runs are torchtitan") as e:
        published.peak("nope")
    assert "\n" not in str(e.value)


def test_recorded_comparison_is_what_the_code_gives_now():
    """Every stored estimate is recomputed, the published figure re-read, the differences re-derived from the stored
    bytes, and the cheapest dry run (TinyLlama) run again; torchtitan's (8 ranks, seq 8192: about a minute) is
    re-run by `python -m helpers.bench published`."""
    from helpers.measure import dryrun

    doc = json.loads(RECORD.read_text())
    assert {"date", "versions", "device", "rows"} <= set(doc)
    assert [r["id"] for r in doc["rows"]] == [r["id"] for r in published.peaks()]
    for rec in doc["rows"]:
        row = published.peak(rec["id"])
        s = published_runs.setup(row)
        assert rec["published"]["bytes"] == row["bytes"] and rec["view"] == row["view"]
        assert rec["setup"] == estimate.run(row["model"], s).setup
        now = estimate.run(row["model"], s)
        assert now.gpu.phases == rec["phases"]["estimate"] and now.gpu.peak_bytes == rec["ours"]["estimate_allocated"]
        for key, rel in rec["like_for_like"].items():
            assert rel == pytest.approx(rec["ours"][key] / row["bytes"] - 1)
        assert ("dry_run_reserved" in rec["like_for_like"]) == (row["view"] == "reserved")
    lit = next(r for r in doc["rows"] if r["id"] == "litgpt-tinyllama-full")
    again = published_runs.compare(lit["id"], dry=dryrun.run(lit["model"], published_runs.setup(
        published.peak(lit["id"])), progress=False))
    for view in ("dry_run_allocated", "dry_run_allocated_blocks", "dry_run_reserved"):
        for phase, stored in lit["phases"][view].items():
            assert again["phases"][view][phase] == pytest.approx(stored, rel=1e-3, abs=1024), (view, phase)


def test_readme_quotes_the_recorded_comparison():
    from helpers.units import to_gib

    readme = (RECORD.parent.parent.parent / "README.md").read_text()
    text = " ".join(readme.split())                                       # line breaks as spaces
    for rec in json.loads(RECORD.read_text())["rows"]:
        key = "dry_run_reserved" if rec["view"] == "reserved" else "estimate_allocated"
        assert f"{to_gib(rec['ours'][key]):.2f} GiB ({rec['like_for_like'][key]:+.1%}" in text, rec["id"]
