"""The GPU mode's own process, and the estimate and the dry run held against full-size runs on real GPUs
(data/results/gpu_runs.json on an H100, gpu_runs_h200.json on an H200, recorded by `python -m helpers.bench gpu`:
torch.cuda's own figures)."""

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
H200 = json.loads((models.DATA_DIR / "results" / gpus.runs_file("NVIDIA H200")).read_text())
H200_BY_ROW = {r["grid_row"]: r for r in H200["rows"]}
EVERY_RUN = RAN + [r for r in H200["rows"] if not r["result"]["meta"]["oom_observed"]]


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


def test_the_records_are_real_gpu_runs_of_the_grid_rows():
    assert RUNS["device"] == "NVIDIA H100 80GB HBM3" and RUNS["versions"]["torch"].startswith("2.")
    assert [(r["model"], T(**r["setup"]), r["alloc_conf"]) for r in RUNS["rows"]] == bench.GPU_GRID[:13]
    assert all(r["error"] is None and r["result"]["mode"] == "gpu" for r in RUNS["rows"])
    assert len(RAN) == len(RUNS["rows"]) - 1
    assert H200["device"] == "NVIDIA H200" and H200["versions"]["bitsandbytes"] == "0.50.2"
    assert sorted(H200_BY_ROW) == list(range(len(bench.GPU_GRID)))          # every row, each once
    assert all((r["model"], T(**r["setup"]), r["alloc_conf"]) == bench.GPU_GRID[r["grid_row"]] and r["error"] is None
               and r["result"]["meta"]["device"] == "NVIDIA H200" for r in H200["rows"])


@pytest.mark.parametrize("row", EVERY_RUN, ids=lambda r: r["result"]["meta"]["device"].split()[1] + " "
                         + bench._label(r["model"], T(**r["setup"])))
def test_the_estimate_is_within_1_percent_under_and_10_over_torch_cudas_allocated_peak(row):
    # the training phases' peak: setup's is the builder's (the model made from its config on the GPU)
    measured = bench.gpu_measured(row["result"])["allocated"]
    ours = estimate.run(row["model"], T(**row["setup"])).gpu.peak_bytes
    assert -0.01 <= ours / measured - 1 <= 0.10


def test_the_same_set_up_allocates_the_same_bytes_on_an_h100_and_an_h200():
    # torch 2.11 and driver 580.159.04 on both: every phase's allocated and reserved peak equal to the byte, so a
    # set-up's bytes do not depend on which Hopper GPU runs it, only whether they fit does
    for i, row in enumerate(RUNS["rows"]):
        h100, h200 = row["result"]["meta"]["cuda_stats"], H200_BY_ROW[i]["result"]["meta"]["cuda_stats"]
        assert all(h100[p]["max_allocated"] == h200[p]["max_allocated"] for p in h100)
        if not row["result"]["meta"]["oom_observed"]:
            assert all(h100[p]["max_reserved"] == h200[p]["max_reserved"] for p in h100)


def test_the_run_the_h100_could_not_hold_ran_on_the_h200_as_the_estimate_said():
    row = next(r for r in RUNS["rows"] if r["result"]["meta"]["oom_observed"])
    i = RUNS["rows"].index(row)
    setup = T(**row["setup"])
    on = {g: estimate.run(row["model"], setup.replace(gpu_gib=gpus.preset(g)["gib"])) for g in ("h100-80gb", "h200")}
    assert on["h100-80gb"].oom["device"] == "gpu" and on["h200"].oom["device"] is None
    assert not H200_BY_ROW[i]["result"]["meta"]["oom_observed"]
    assert abs(on["h200"].gpu.peak_bytes / bench.gpu_measured(H200_BY_ROW[i]["result"])["allocated"] - 1) < 0.001


def test_the_qlora_builders_setup_peak_is_set_apart_and_the_training_phases_agree():
    # the 4-bit base made whole in bf16 on the GPU before quantising (helpers.measure.gpu._build): setup's peak is
    # the builder's; forward, backward, step and steady agree with the census to cuBLAS's workspaces (64 MiB)
    row = H200_BY_ROW[13]
    assert T(**row["setup"]).base_weights == "nf4-dq"
    m = bench.gpu_measured(row["result"])
    assert m["builder_peak"] and m["setup_allocated"] > 1.9 * m["allocated"]
    census = row["result"]["gpu"]["phases"]
    for phase, v in row["result"]["meta"]["cuda_stats"].items():
        if phase != "setup":
            assert 0 <= v["max_allocated"] - census[phase] <= 64 * 2**20 + 2**20, phase


@pytest.mark.parametrize("i", [15, 16, 17, 18, 19, 20])
def test_the_reference_reward_and_actor_runs_agree_with_the_census_phase_by_phase_on_the_gpu(i):
    # DPO and KTO with their reference, a reward model, OpenRLHF's actor at 26,048 tokens: every training phase's
    # torch.cuda peak above the tracker's census by cuBLAS's workspaces and kernel temporaries, under 200 MiB
    row = H200_BY_ROW[i]
    census = row["result"]["gpu"]["phases"]
    assert T(**row["setup"]).run in ("dpo", "kto", "rm", "grpo")
    for phase, v in row["result"]["meta"]["cuda_stats"].items():
        if phase != "setup":
            assert 0 <= v["max_allocated"] - census[phase] < 200 * 2**20, phase


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


def test_the_readme_quotes_the_h200_record():
    import statistics
    from pathlib import Path

    ran = [r for r in H200["rows"] if not r["result"]["meta"]["oom_observed"]]
    diffs = [estimate.run(r["model"], T(**r["setup"])).gpu.peak_bytes / bench.gpu_measured(r["result"])["allocated"] - 1
             for r in ran]
    actor = H200_BY_ROW[19]
    assert actor["model"] == "qwen2.5-7b" and T(**actor["setup"]).seq == 26048
    readme = " ".join((Path(__file__).resolve().parent.parent / "README.md").read_text().split())
    assert f"runs {len(bench.GPU_GRID)} full-size set-ups" in readme and f"all {len(ran)}:" in readme
    assert (f"(Qwen2.5-7B, {bench.gpu_measured(actor['result'])['allocated'] / 2**30:.2f} GiB allocated, the estimate "
            f"{estimate.run(actor['model'], T(**actor['setup'])).gpu.peak_bytes / 2**30:.2f};") in readme
    assert (f"median {statistics.median(diffs):+.2%}, lowest {min(diffs):+.2%}, none over {max(diffs):+.1%}"
            in readme)
    dpo = H200_BY_ROW[15]
    replayed = dpo["result"]["meta"]["allocator_model"]["phases"]["steady"]["reserved"]
    assert T(**dpo["setup"]).run == "dpo" and T(**dpo["setup"]).ref == "copy"
    assert (f"gives {replayed / 2**30:.2f} GiB against the GPU's "
            f"{bench.gpu_measured(dpo['result'])['reserved'] / 2**30:.2f}") in readme


@pytest.mark.parametrize("setup", [
    T(run="dpo", batch=2, seq=64), T(run="dpo", lora_rank=8, seq=64, checkpointing="full"),
    T(run="kto", precision="bf16", adam_impl="fused", batch=2, seq=64), T(run="rm", batch=2, seq=64),
    T(run="grpo", dpo_logps="openrlhf", precision="bf16", seq=64, completion=32, attention="flash",
      checkpointing="full"),
    T(lora_rank=8, base_weights="nf4-dq", seq=64, checkpointing="full")], ids=lambda s: s.run + str(s.base_weights))
def test_the_gpu_modes_loop_trains_each_run_type_as_the_scaled_run_does(setup):
    # the same control flow on this CPU (gpu.measure on another device): the reference copy built, the pairs'
    # batch doubled, the 4-bit base's states labelled as parameters; the census against the estimate, every phase
    import torch

    from helpers.measure import gpu, scaled

    twin, s = scaled.scaled_setup("llama-3.2-1b", setup)
    r = gpu.measure(models.spec(str(twin)), s, torch.device("cpu"), steps=2)
    e = estimate.run(str(twin), s)
    for phase, got in r.host.phases.items():      # (a reward model's forward: the estimate 1.7% over on its twin)
        assert abs(e.gpu.phases[phase] / got - 1) < 0.02, (phase, got, e.gpu.phases[phase])
    assert r.meta["oom_observed"] is None


def test_the_grid_rows_are_read_and_a_bad_spec_refused_in_one_line():
    from helpers.errors import InputError

    assert bench.grid_rows("13-14,0") == [13, 14, 0] and bench.grid_rows(None) == list(range(len(bench.GPU_GRID)))
    for bad in ("13-99", "x", "5-3", "-1"):
        with pytest.raises(InputError, match="is not a row or range of rows of the GPU grid") as err:
            bench.grid_rows(bad)
        assert "\n" not in str(err.value)


def test_each_gpu_writes_its_own_record_and_its_context_is_its_own():
    assert gpus.runs_file("NVIDIA H100 80GB HBM3") == "gpu_runs.json"
    assert gpus.runs_file("NVIDIA H200") == "gpu_runs_h200.json"
    assert gpus.runs_file("NVIDIA B200") == "gpu_runs_nvidia-b200.json"
    assert gpus.cuda_context("h200")["url"] == "data/results/gpu_runs_h200.json"
    assert "assumed for" in gpus.cuda_context("a100-80gb")["note"]


def test_a_subset_run_keeps_the_recorded_rows_it_does_not_repeat(tmp_path):
    import shutil

    path = tmp_path / "gpu_runs_h200.json"
    shutil.copy(models.DATA_DIR / "results" / "gpu_runs_h200.json", path)
    kept = bench._kept_rows(path, "NVIDIA H200", [13, 14])
    assert sorted(r["grid_row"] for r in kept) == [i for i in range(len(bench.GPU_GRID)) if i not in (13, 14)]
    assert bench._kept_rows(path, "NVIDIA H100 80GB HBM3", [13]) == []          # another GPU's record: none kept
    h100 = bench._kept_rows(models.DATA_DIR / "results" / gpus.GPU_RUNS, "NVIDIA H100 80GB HBM3", [0])
    assert [r["grid_row"] for r in h100] == list(range(1, 13))                   # an older file: numbered by position


def test_the_bench_flags_are_refused_where_they_do_not_apply():
    for args, said in ((["gpu-row"], "needs --row 0 to"), (["estimate", "--rows", "3"], "--rows is for `bench gpu`")):
        out = subprocess.run([sys.executable, "-m", "helpers.bench", *args], capture_output=True, text=True)
        assert out.returncode == 2 and said in out.stdout and "Traceback" not in out.stderr
    listed = subprocess.run([sys.executable, "-m", "helpers.bench", "gpu", "--list"], capture_output=True, text=True,
                            check=True).stdout.splitlines()
    assert len(listed) == len(bench.GPU_GRID) and "openrlhf" in listed[19] and listed[19].split()[:2] == ["19", "qwen2.5-7b"]
