"""The reserved view end to end: a dry run's allocations through the allocator model, the device total, the
verdict, GPU presets, and the published reserved figure it is checked against."""

import json

import pytest

from helpers import gpus, published
from helpers.__main__ import main
from helpers.measure import dryrun
from helpers.training import TrainSetup
from helpers.units import GiB, MiB

PEFT = TrainSetup(batch=4, seq=768, precision="bf16", adam_impl="foreach")


@pytest.fixture(scope="module")
def peft():
    return dryrun.run("llama-3.2-3b", PEFT, progress=False, gpu="l40s")


def test_reserved_covers_allocated_in_every_phase(peft):
    a = peft.meta["allocator"]["phases"]
    for phase, bytes_ in peft.gpu.phases.items():
        assert a[phase]["reserved"] >= a[phase]["allocated"] >= bytes_     # blocks round tensors up, segments blocks
        assert peft.gpu.device_total[phase] == peft.gpu.reserved[phase] + sum(peft.gpu.overhead.values())


def test_peft_llama_3b_reserved_lands_within_5_percent(peft):
    row = published.reserved("llama-3.2-3b")
    s = row["setup"]
    assert (s["batch"], s["seq"], s["precision"], s["adam_impl"]) == (PEFT.batch, PEFT.seq, PEFT.precision,
                                                                        PEFT.adam_impl)
    modelled, reported = max(peft.gpu.reserved.values()), row["accelerator_memory_max"]
    assert abs(modelled / reported - 1) < 0.05
    assert max(peft.gpu.phases.values()) < 0.95 * reported             # the tensors alone are further off


def test_expandable_segments_reserve_less(peft):
    grown = dryrun.run("llama-3.2-3b", PEFT, progress=False, alloc_conf="expandable_segments:True")
    assert max(grown.gpu.reserved.values()) < max(peft.gpu.reserved.values())
    assert grown.gpu.phases == peft.gpu.phases                         # same tensors, another allocator setting


def test_verdict_names_what_took_it_over(capsys):
    # 33.5 GiB: the tensors (32.9 GiB) and the context fit, the allocator's reserve (34.6 GiB) does not
    code = main(["measure", "--mode", "dry-run", "--model", "llama-3.2-3b", "--batch", "4", "--seq", "768",
                 "--precision", "bf16", "--gpu-gib", "33.5", "--no-progress", "--json"])
    d = json.loads(capsys.readouterr().out)
    v = d["meta"]["allocator"]["verdict"]
    assert code == 0 and d["oom"] == {"device": None, "phase": None}  # allocated alone fits
    assert v["fits"] is False and v["part"] == "fragmentation" and v["released_cache"]
    assert set(d["gpu"]) >= {"reserved", "overhead", "device_total"}


def test_gpu_presets_give_nvidia_smi_capacities(capsys):
    assert gpus.preset("h100-80gb")["mib"] == 81559 and gpus.preset("a100-80gb")["bytes"] == 81920 * MiB
    for name in gpus.PRESETS:
        row = gpus.preset(name)
        assert row["url"].startswith("https://") and row["gib"] * GiB == row["bytes"]
    code = main(["estimate", "--model", "llama-3-8b", "--gpu", "l40s", "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["gpu"]["capacity_bytes"] == 46068 * MiB


def test_nccl_buffers_only_where_a_strategy_communicates():
    assert gpus.nccl_buffers("single", 1)["bytes"] == 0
    n = gpus.nccl_buffers("zero2", 8)
    assert n["bytes"] == 4 * MiB * gpus.NCCL_CHANNELS_ASSUMED * gpus.NCCL_PEERS_RING and "assumed" in n["detail"]
    assert gpus.cuda_context("h100-80gb")["url"].startswith("https://github.com/pytorch/pytorch/issues/")
    assert gpus.cuda_context("rtx-3090")["mib"] == 256            # the one GPU with its own measured context


@pytest.mark.parametrize("args,needle", [
    (["--gpu", "h300"], "gpu must be one of a10, a100-40gb"),
    (["--gpu", "l4", "--gpu-gib", "24"], "exclude each other"),
])
def test_bad_gpu_flags(capsys, args, needle):
    code = main(["estimate", "--model", "llama-3-8b", *args])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("mode,conf,needle", [
    ("dry-run", "expandable_segments:maybe", "allocator setting must be"),
    ("scaled", "expandable_segments:True", "--alloc-conf applies to --mode dry-run"),
])
def test_bad_allocator_settings(capsys, mode, conf, needle):
    code = main(["measure", "--mode", mode, "--model", "llama-3-8b", "--alloc-conf", conf])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_gpu_mode_summarises_the_allocator_snapshot():
    from helpers.measure.gpu import segments_summary

    snap = [{"total_size": 20 * MiB, "allocated_size": 4 * MiB, "segment_type": "large",
             "blocks": [{"size": 4 * MiB, "state": "active_allocated"}, {"size": 16 * MiB, "state": "inactive"}]},
            {"total_size": 2 * MiB, "allocated_size": 512, "segment_type": "small",
             "blocks": [{"size": 512, "state": "active_allocated"}, {"size": 2 * MiB - 512, "state": "inactive"}]}]
    s = segments_summary(snap)
    assert s["segments"] == 2 and s["reserved"] == 22 * MiB and s["allocated"] == 4 * MiB + 512
    assert s["largest_free_block"] == 16 * MiB and s["by_pool"] == {"large": 20 * MiB, "small": 2 * MiB}


def test_gpu_mode_table_reads_reserved_as_measured():
    from helpers import report
    from helpers.results import DeviceMemory, Result, empty_breakdown

    b = empty_breakdown(["setup", "forward"])
    b["forward"]["activations"] = 3 * GiB
    gpu = DeviceMemory(b, 80 * GiB, reserved={"setup": 0, "forward": 4 * GiB},
                       overhead={"outside_allocator": 500 * MiB})
    r = Result("m", 1, "gpu", TrainSetup().__dict__, gpu, DeviceMemory(empty_breakdown(["setup", "forward"])))
    text = report.table(r)
    assert "measured (torch.cuda.max_memory_reserved" in text and "500 MiB" in text
    assert r.gpu.device_total == {"setup": 500 * MiB, "forward": 4 * GiB + 500 * MiB}
    assert Result.from_dict(r.to_dict()).gpu.device_total == r.gpu.device_total
