"""The result format: totals are sums of categories, JSON round-trips, saves are atomic."""

import json
from pathlib import Path

from helpers import cases, estimate
from helpers.results import Result


def test_round_trip_and_atomic_save(tmp_path):
    r = estimate.run("llama-3-8b", cases.setup(1))
    path = r.save(tmp_path / "results" / "case1.json")
    assert [p.name for p in path.parent.iterdir()] == ["case1.json"]      # no temporary left behind
    back = Result.load(path)
    assert back.to_dict() == json.loads(json.dumps(r.to_dict()))
    assert back.oom == r.oom


def test_items_sum_to_phases():
    r = estimate.run("qwen2.5-72b", cases.setup(3))
    for dev in ("gpu", "host"):
        d = r.device(dev)
        for phase, total in d.phases.items():
            assert total == sum(d.breakdown[phase].values())
        alive = [i for i in r.items if i["device"] == dev and d.peak_phase in i["phases"]]
        assert sum(i["bytes"] for i in alive) >= d.peak_bytes     # items of other moments in the phase may add


def test_every_case_loads_with_reported_figures():
    numbers = list(cases._all())
    assert numbers == [str(n) for n in range(1, 8)]
    for n in numbers:
        c = cases.case(n)
        src = c["source"]
        assert c["reported"] and src["upstream"]
        assert ("write_up" in src) == (int(n) <= 6)                   # case 7 comes from its upstream thread alone
        urls = [u["url"] for u in src["upstream"] + src["docs"]] + ([src["write_up"]["url"]] if "write_up" in src else [])
        assert all(u.startswith("https://") for u in urls)
        assert cases.citation(n).isascii()                            # figure titles: no CJK glyphs in the font
        assert all(u in cases.sources_markdown(n) for u in urls)
        estimate.run(c["model"], cases.setup(n, fixed=True))
    assert {row["case"] for row in cases.checklist()} == {int(n) for n in numbers}     # one checklist row per case


def test_nothing_refers_to_files_outside_the_repository():
    """Readers have only the repository: no path to the project's private workspace or its raw write-ups."""
    import re
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    files = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout.split()
    pattern = re.compile(r"\.\./shared|(^|[^a-z_])seeds/[0-9]{3}_|CASES\.md|FINDINGS\.md")
    offenders = [f for f in files if f != "tests/test_results.py" and (root / f).is_file()
                 and pattern.search((root / f).read_text(errors="ignore"))]
    assert offenders == []


def test_dryrun_vs_estimate_file_is_what_the_code_gives_now():
    """data/results/dryrun_vs_estimate.json (written by `python -m helpers.bench dryrun`, read by notebook 06) must be
    regenerated when the estimator or the dry run changes: every stored estimate is recomputed here, and the dry runs
    of the two cheapest set-ups are run again."""
    from pathlib import Path

    import pytest

    from helpers.measure import dryrun
    from helpers.training import TrainSetup

    doc = json.loads((Path(__file__).resolve().parent.parent / "data" / "results" / "dryrun_vs_estimate.json").read_text())
    assert {"date", "versions", "device", "rows"} <= set(doc) and len(doc["rows"]) >= 20
    for row in doc["rows"]:
        now = estimate.run(row["model"], TrainSetup(**row["setup"]), lifecycle=False)
        for dev in ("gpu", "host"):
            assert now.to_dict()[dev]["phases"] == row["estimate"][dev]["phases"], (row["model"], row["setup"], dev)
    cheapest = sorted(doc["rows"], key=lambda r: r["dry_run"]["params"] * r["setup"]["seq"])[:2]
    for row in cheapest:
        again = dryrun.run(row["model"], TrainSetup(**row["setup"]), progress=False).to_dict()
        for dev in ("gpu", "host"):
            for phase, stored in row["dry_run"][dev]["phases"].items():
                assert again[dev]["phases"][phase] == pytest.approx(stored, rel=1e-3, abs=1024), (row["model"], dev, phase)


def test_the_readme_quotes_the_grid_file():
    """The README's count of dry-run set-ups and its largest phase difference are the recorded file's."""
    root = Path(__file__).resolve().parent.parent
    rows = json.loads((root / "data" / "results" / "dryrun_vs_estimate.json").read_text())["rows"]
    readme = " ".join((root / "README.md").read_text().split())
    worst = max(r["worst_phase_rel_diff"] for r in rows)
    assert f"on {len(rows)} set-ups (" in readme and f"phase difference {worst:.2%})" in readme
