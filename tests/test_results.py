"""The result format: totals are sums of categories, JSON round-trips, saves are atomic."""

import json

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
    for n in range(1, 7):
        c = cases.case(n)
        assert c["source"].startswith("seeds/") and c["reported"]
        estimate.run(c["model"], cases.setup(n, fixed=True))
