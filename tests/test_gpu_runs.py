"""The GPU mode's own process, and the estimate and the dry run held against full-size runs on a real GPU
(data/results/gpu_runs.json, recorded by `python -m helpers.bench gpu` on an H100: torch.cuda's own figures)."""

import json
import os
import subprocess
import sys

import pytest

from helpers import bench, estimate, gpus, models
from helpers.errors import MeasurementError
from helpers.training import TrainSetup as T

RUNS = json.loads((models.DATA_DIR / "results" / gpus.GPU_RUNS).read_text())
RAN = [r for r in RUNS["rows"] if r["result"] and not r["result"]["meta"]["oom_observed"]]


@pytest.mark.parametrize("env,name", [({}, "gpu"), ({"OOM_CASEBOOK_CUDA_PROCESS": "1"}, "privateuseone")])
def test_the_fake_gpu_is_registered_everywhere_but_in_a_gpu_runs_own_process(env, name):
    # a registered PrivateUse1 backend breaks every CUDA backward in its process (seen on the H100 with torch 2.11)
    code = "import helpers.measure, torch; print(torch._C._get_privateuse1_backend_name())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[-1] == name


def test_a_gpu_run_from_a_process_with_the_fake_gpu_runs_in_one_of_its_own():
    from helpers.measure import fakegpu, gpu

    assert fakegpu.registered()                       # this test process imported helpers.measure
    with pytest.raises(MeasurementError, match="needs a CUDA GPU"):   # the job reached `run` in the new process
        gpu._in_own_process("qwen2.5-0.5b", T(seq=64), None, 2)


def test_the_record_is_a_real_gpu_run_of_every_grid_row():
    assert RUNS["device"] == "NVIDIA H100 80GB HBM3" and RUNS["versions"]["torch"].startswith("2.")
    assert [(r["model"], T(**r["setup"]), r["alloc_conf"]) for r in RUNS["rows"]] == bench.GPU_GRID
    assert all(r["error"] is None and r["result"]["mode"] == "gpu" for r in RUNS["rows"])
    assert len(RAN) == len(RUNS["rows"]) - 1


@pytest.mark.parametrize("row", RAN, ids=lambda r: bench._label(r["model"], T(**r["setup"])))
def test_the_estimate_is_within_1_percent_under_and_10_over_torch_cudas_allocated_peak(row):
    measured = bench.gpu_measured(row["result"])["allocated"]
    ours = estimate.run(row["model"], T(**row["setup"])).gpu.peak_bytes
    assert -0.01 <= ours / measured - 1 <= 0.10


def test_the_run_that_died_is_judged_out_of_memory():
    row = next(r for r in RUNS["rows"] if r["result"]["meta"]["oom_observed"])
    cap = row["result"]["gpu"]["capacity_bytes"]
    assert row["result"]["meta"]["oom_observed"]["phase"] == "step"
    r = estimate.run(row["model"], T(**row["setup"]).replace(gpu_gib=cap / 2**30))
    assert r.oom["device"] == "gpu" and r.oom["phase"] == "step"


@pytest.mark.parametrize("model", ["qwen3-8b", "llama-3-8b", "llama-3.2-1b"])
def test_the_dry_runs_device_total_is_the_gpus_within_half_a_percent(model):
    # the device total: the allocator model's reserve + cuBLAS's workspaces + the measured context, against
    # torch.cuda's reserved + the bytes outside the allocator; the rows nearest the 79 GiB capacity
    from helpers.measure import dryrun

    near = [r for r in RAN if r["model"] == model and bench.gpu_measured(r["result"])["reserved"] > 70 * 2**30]
    assert near
    for row in near:
        m = bench.gpu_measured(row["result"])
        x = dryrun.recheck(model, T(**row["setup"]), gpu="h100-80gb", alloc_conf=row["alloc_conf"])
        assert abs(x["device_total"] / (m["reserved"] + m["outside_allocator"]) - 1) < 0.005


def test_the_readme_quotes_the_recorded_allocated_peaks():
    import statistics
    from pathlib import Path

    diffs = [estimate.run(r["model"], T(**r["setup"])).gpu.peak_bytes / bench.gpu_measured(r["result"])["allocated"] - 1
             for r in RAN]
    readme = " ".join((Path(__file__).resolve().parent.parent / "README.md").read_text().split())
    assert f"median {statistics.median(diffs):+.2%} (lowest {min(diffs):+.2%}, Gemma-2-2B)" in readme
