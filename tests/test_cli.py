"""The command line: flags, the JSON object, readable errors with exit code 2 and no traceback."""

import json
import subprocess
import sys

import pytest

from helpers.__main__ import main
from helpers.errors import InputError


def cli(capsys, *args):
    code = main(["estimate", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_object_has_the_promised_keys(capsys):
    code, out, _ = cli(capsys, "--model", "llama-3-8b", "--strategy", "zero2", "--seq", "128", "--attention",
                       "flash", "--grad-checkpointing", "--gpu-gib", "80", "--json")
    d = json.loads(out)
    assert code == 0 and d["model"] == "llama-3-8b" and d["params"] == 8_030_261_248
    for dev in ("gpu", "host"):
        assert {"peak_bytes", "peak_phase", "phases", "categories"} <= set(d[dev])
        assert d[dev]["peak_bytes"] == max(d[dev]["phases"].values())
        assert sum(d[dev]["categories"].values()) == d[dev]["peak_bytes"]
    assert d["oom"] == {"device": "gpu", "phase": "step"}
    assert d["evidence"]["kind"] == "estimated"


def test_every_flag_is_accepted(capsys):
    code, out, _ = cli(capsys, "--model", "qwen2.5-72b", "--batch", "2", "--seq", "1024", "--precision", "bf16-mixed",
                       "--strategy", "zero3", "--gpus", "16", "--gpus-per-node", "8", "--offload-optimizer",
                       "--offload-params", "--offload-ratio", "0.9", "--no-pin-memory", "--grad-checkpointing",
                       "--fused-ce", "--attention", "eager", "--gpu-gib", "80", "--host-gib", "1300", "--resume", "--json")
    d = json.loads(out)
    assert code == 0 and "resume" in d["host"]["phases"] and d["setup"]["pin_memory"] is False
    code, out, _ = cli(capsys, "--model", "llama-3-8b", "--adam-impl", "fused", "--pin-memory", "--precision", "bf16")
    assert code == 0 and "GiB = 2^30 bytes" in out and "needs:" in out


@pytest.mark.parametrize("args,needle", [
    (["--model", "gpt-17"], "unknown model 'gpt-17'"),
    (["--model", "/tmp/definitely/missing/config.json"], "unknown model"),
    (["--model", "llama-3-8b", "--batch", "0"], "batch must be a positive integer, got 0"),
    (["--model", "llama-3-8b", "--batch", "-3"], "batch must be a positive integer, got -3"),
    (["--model", "llama-3-8b", "--seq", "0"], "seq must be a positive integer, got 0"),
    (["--model", "llama-3-8b", "--strategy", "ddp", "--gpus", "0"], "gpus must be a positive integer, got 0"),
    (["--model", "llama-3-8b", "--strategy", "zero3", "--offload-optimizer", "--offload-ratio", "1.5"],
     "offload_ratio must be a number in [0, 1], got 1.5"),
    (["--model", "llama-3-8b", "--strategy", "zero3", "--offload-optimizer", "--offload-ratio", "-0.1"],
     "offload_ratio must be a number in [0, 1], got -0.1"),
    (["--model", "llama-3-8b", "--strategy", "zero2", "--offload-optimizer", "--offload-ratio", "0.9"],
     "only by DeepSpeed ZeRO-3"),
    (["--model", "llama-3-8b", "--strategy", "zero3", "--offload-ratio", "0.9"], "needs offload_optimizer"),
    (["--model", "llama-3-8b", "--strategy", "fsdp2", "--gpus", "2", "--offload-optimizer"],
     "offloads parameters, gradients and optimizer states together"),
    (["--model", "llama-3-8b", "--strategy", "zero2", "--offload-params"], "offload_params needs zero3"),
    (["--model", "llama-3-8b", "--strategy", "ddp", "--offload-optimizer"], "cannot offload"),
    (["--model", "llama-3-8b", "--strategy", "zero9"], "unknown strategy 'zero9': allowed are single, ddp"),
    (["--model", "llama-3-8b", "--precision", "fp8"], "unknown precision 'fp8': allowed are bf16, bf16-mixed, fp16-mixed, fp32"),
    (["--model", "llama-3-8b", "--attention", "paged"], "unknown attention 'paged'"),
    (["--model", "llama-3-8b", "--adam-impl", "apex"], "unknown adam_impl 'apex'"),
    (["--model", "llama-3-8b", "--strategy", "zero2", "--offload-optimizer", "--adam-impl", "fused"],
     "steps on the host with DeepSpeedCPUAdam"),
    (["--model", "llama-3-8b", "--strategy", "zero2", "--precision", "bf16"], "use precision 'bf16-mixed'"),
    (["--model", "llama-3-8b", "--gpus", "2"], "strategy 'single' runs on one GPU"),
    (["--model", "llama-3-8b", "--gpu-gib", "-1"], "gpu_gib must be a positive, finite number of GiB, from 1/1024 (1 MiB) to 1,048,576 (None for no capacity), got -1.0"),
])
def test_bad_input_is_named(capsys, args, needle):
    code, out, err = cli(capsys, *args)
    assert code == 2 and out == ""
    assert needle in err and err.startswith("error: ") and "Traceback" not in err


def test_module_entry_point_exits_2_without_traceback():
    p = subprocess.run([sys.executable, "-m", "helpers", "estimate", "--model", "nope", "--json"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and p.stdout == "" and "Traceback" not in p.stderr
    assert "unknown model 'nope'" in p.stderr and "llama-3-8b" in p.stderr


def test_models_listing(capsys):
    assert main(["models"]) == 0
    assert "8,030,261,248" in capsys.readouterr().out


def test_items_listing_names_each_buffer(capsys):
    code, out, _ = cli(capsys, "--model", "llama-3-8b", "--strategy", "zero2", "--seq", "128", "--items")
    assert code == 0 and "fp32 gradient partition (made at the step)" in out
    assert "state dict cloned to the host for save_model" in out            # the host's only buffer: the save's


def test_measure_dry_run_prints_the_same_object_and_saves_it(capsys, tmp_path):
    from pathlib import Path

    tiny = str(Path(__file__).parent / "data" / "tiny-llama.json")
    out_file = tmp_path / "results" / "tiny.json"
    code = main(["measure", "--mode", "dry-run", "--model", tiny, "--seq", "64", "--json", "--no-progress",
                 "--save", str(out_file)])
    d = json.loads(capsys.readouterr().out)
    assert code == 0 and d["mode"] == "dry-run" and d["evidence"]["kind"] == "measured"
    for dev in ("gpu", "host"):
        assert {"peak_bytes", "peak_phase", "phases", "categories"} <= set(d[dev])
    assert json.loads(out_file.read_text())["gpu"]["peak_bytes"] == d["gpu"]["peak_bytes"]
    from helpers import snapshots  # and the allocator model's snapshot beside it, at its peak
    snap = snapshots.load(out_file.with_suffix(".pickle"))
    assert d["meta"]["snapshot"]["oom"] is None and snapshots.summary(snap)["allocated"] > 0


def test_measure_refuses_zero3_with_a_reason(capsys):
    assert main(["measure", "--mode", "dry-run", "--model", "llama-3-8b", "--strategy", "zero3", "--gpus", "8",
                 "--no-progress"]) == 2
    assert "DeepSpeed cannot run on fake tensors" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["dry-run", "scaled"])
@pytest.mark.parametrize("flags,needle", [(["--fused-ce", "--strategy", "fsdp2", "--gpus", "2"], "needs the output head's whole weight"),
                                          (["--resume"], "resume is modelled")])
def test_options_a_measurement_cannot_run_are_refused_not_ignored(capsys, mode, flags, needle):
    assert main(["measure", "--mode", mode, "--model", "llama-3-8b", *flags, "--no-progress"]) == 2
    assert needle in capsys.readouterr().err


def test_gpus_on_files_that_name_no_launcher_means_ddp(tmp_path, capsys):
    """A TRL file with no accelerate/DeepSpeed/FSDP companion says nothing of the world size; `--gpus 2` then runs the
    Trainer as 2 DDP processes (what accelerate launch or torchrun do), listed as an override, not refused."""
    (tmp_path / "t.yaml").write_text("model_name_or_path: meta-llama/Llama-3.2-1B\nuse_peft: true\n")
    assert main(["estimate", "--from", str(tmp_path / "t.yaml"), "--gpus", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["setup"]["strategy"], doc["setup"]["gpus"]) == ("ddp", 2)
    assert any(o["field"] == "strategy" and o["value"] == "ddp" for o in doc["imported"]["overrides"])



def test_gpu_presets_as_people_write_them(capsys):
    """--gpu takes 'H100', 'RTX 4090', 'Tesla T4' as the presets they name; an ambiguous 'A100' names both."""
    from helpers import gpus

    assert [gpus.canonical(n) for n in ("H100 80GB", "RTX 4090", "4090", "Tesla T4", "NVIDIA A100 80GB", "A10G",
                                        "RTX A6000", "H200")] == [
        "h100-80gb", "rtx-4090", "rtx-4090", "t4", "a100-80gb", "a10g", "rtx-a6000", "h200"]
    assert [gpus.canonical(n) for n in ("NVIDIA H100 80GB HBM3", "A100-SXM4-80GB", "Tesla V100-SXM2-32GB",
                                        "A100-80G")] == ["h100-80gb", "a100-80gb", "v100-32gb", "a100-80gb"]
    with pytest.raises(InputError, match="did you mean l40s or l4"):
        gpus.canonical("l40")
    for short, both in (("V100", "v100-32gb or v100-16gb"), ("H100", "h100-80gb or h100-nvl")):
        with pytest.raises(InputError, match=both):
            gpus.canonical(short)
    base = ["fit", "--model", "llama-3.2-1b", "--lora-rank", "8", "--json"]
    assert main(base + ["--gpu", "RTX 4090"]) == 0
    loose = json.loads(capsys.readouterr().out)
    assert main(base + ["--gpu", "rtx-4090"]) == 0
    drop = lambda doc: [{k: v for k, v in f.items() if k != "seconds"} for f in doc["fit"]]  # noqa: E731 (time taken)
    assert drop(json.loads(capsys.readouterr().out)) == drop(loose) and loose["fit"][0]["value"] >= 1
    assert main(base + ["--gpu", "A100"]) == 2
    err = capsys.readouterr().err.strip()
    assert "'A100' could be a100-80gb or a100-40gb" in err and "\n" not in err


def test_a_tight_fit_says_what_the_estimate_leaves_out(capsys):
    """An estimate that fits with less headroom than the caching allocator took on the recorded dry-run grid says so
    (with the grid's median and largest reserve over the tensors, from data/results/dryrun_vs_estimate.json); its
    figures and verdict stay those of the estimate. One with room to spare says nothing."""
    import statistics
    from pathlib import Path

    from helpers import report

    ratios = report.grid_reserve_ratios()
    assert len(ratios) >= 20 and all(x >= 1 for x in ratios)
    readme = " ".join((Path(__file__).resolve().parent.parent / "README.md").read_text().split())
    median, most = statistics.median(ratios) - 1, max(ratios) - 1
    assert f"(a median {median:.0%}, up to {most:.0%} above the tensors" in readme      # the README quotes the file
    base = ["estimate", "--model", "qwen2.5-1.5b", "--lora-rank", "16", "--seq", "960", "--gpu", "l4"]
    assert main(base + ["--batch", "4"]) == 0
    out = capsys.readouterr().out
    assert "fits: 20.7 GiB of 22.0 GiB" in out and "headroom 3%: OOM from the allocator's cache is likely" in out
    # (22.0 - 0.77 context - 0.02 cuBLAS) / 20.7 GiB; 22.0 GiB: what CUDA gives a process on an L4
    assert "counts tensors, the CUDA context and cuBLAS's workspaces" in out
    assert main(base + ["--batch", "1", "--json"]) == 0
    assert "reserve_caution" not in json.loads(capsys.readouterr().out)


def test_with_a_preset_the_estimate_counts_the_cuda_context_as_fit_does(capsys):
    """Tensors that fit the card but not beside the preset's CUDA context are an OOM in estimate's verdict, the
    same line fit gives (they disagreed: estimate said fits, fit said the next sequence did not)."""
    base = ["--model", "qwen2.5-1.5b", "--lora-rank", "16", "--gpu", "l4", "--checkpointing", "full"]
    assert main(["fit", *base, "--vary", "seq", "--json"]) == 0
    f = json.loads(capsys.readouterr().out)["fit"][0]
    assert main(["estimate", *base, "--seq", str(f["next_value"])]) == 0
    out = capsys.readouterr().out
    assert "OOM on GPU with the device total" in out and "the CUDA context tips it over" in out
    assert main(["estimate", *base, "--seq", str(f["value"])]) == 0
    assert "fits:" in capsys.readouterr().out


def test_an_assumed_cuda_context_names_the_preset_it_stands_in_for(capsys):
    """--gpu A100-80GB has no measured CUDA context here: the verdict says the H100's is assumed for it, so the preset
    does not read as ignored (a new user's question)."""
    assert main(["estimate", "--model", "llama-3.2-1b", "--gpu", "A100-80GB", "--offline"]) == 0
    assert "(none measured on a100-80gb: an H100's, assumed)" in capsys.readouterr().out
