"""Memory snapshots: one written by torch itself on this CPU (its profiler's route), one written by the allocator model
from a dry run (and accepted by torch's own snapshot tools), both read back and explained; every older layout and
every broken file refused in one line without running anything."""

import gzip
import pickle

import pytest
import torch
from torch.cuda import _memory_viz

from helpers import explain, snapshots
from helpers.__main__ import main
from helpers.errors import InputError
from helpers.measure import dryrun
from helpers.training import TrainSetup
from helpers.units import GiB


@pytest.fixture(scope="module")
def torch_written(tmp_path_factory):
    """A snapshot torch writes on a CPU: a profiled training step of a small MLP with AdamW, through
    torch.cuda._memory_viz._profile_to_snapshot (the profiler's memory timeline as segments, blocks and a trace)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    opt = torch.optim.AdamW(net.parameters())
    x = torch.randn(32, 256)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                record_shapes=True, with_stack=True) as prof:
        for _ in range(2):
            net(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    path = tmp_path_factory.mktemp("snap") / "cpu.pickle"
    path.write_bytes(pickle.dumps(_memory_viz._profile_to_snapshot(prof)))
    return path


def test_a_snapshot_torch_wrote_is_read_and_its_blocks_named(torch_written):
    s = snapshots.load(torch_written)
    raw = pickle.loads(torch_written.read_bytes())
    sm = snapshots.summary(s)
    seg = raw["segments"][0]
    assert sm["reserved"] == seg["total_size"] == sum(b["size"] for b in seg["blocks"])
    assert sm["allocated"] == sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
    rows = snapshots.named(s)
    names = {r["name"] for r in rows if r["how"] == "profiler"}
    # what is alive after two steps: the parameters and AdamW's two states per parameter (the profiler's own words)
    assert {"parameter", "optimizer_state"} <= names
    params = sum(p.numel() * 4 for p in net_params())
    by = {n: b for n, _, b in snapshots.by_name(rows)}
    n = len(net_params())
    # exp_avg and exp_avg_sq of each parameter, and each parameter's step counter (a float32 scalar)
    assert by["parameter"] == params and by["optimizer_state"] == 2 * params + n * 4


def net_params():
    return list(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)).parameters())


@pytest.fixture(scope="module")
def modelled(tmp_path_factory):
    """The allocator model's snapshot of a Qwen2.5-0.5B full fine-tune dry run on a GPU smaller than its optimizer
    step needs (between its backward and its step)."""
    path = tmp_path_factory.mktemp("snap") / "model.pickle"
    setup = TrainSetup(seq=256, adam_impl="fused", gpu_gib=6.0)
    r = dryrun.run("qwen2.5-0.5b", setup, progress=False, snapshot=path)
    return path, r


def test_the_allocator_models_snapshot_ends_at_its_out_of_memory(modelled):
    path, r = modelled
    info = r.meta["snapshot"]
    assert info["oom"] is not None and info["oom"]["phase"] == "step"
    s = snapshots.load(path)
    sm = snapshots.summary(s)
    assert sm["allocated"] == info["oom"]["allocated"] and sm["reserved"] == info["oom"]["reserved"]
    assert s.oom["size"] == info["oom"]["requested_bytes"]
    rows = snapshots.named(s)
    assert rows and all(r["how"] == "allocator model" for r in rows)
    made_in_setup = sum(r["requested"] for r in rows if r["name"].startswith("parameters, made in setup"))
    # the fp32 weights (the model's 494,032,768 parameters), its two rotary buffers (2 x 32 fp32) and the input ids
    # made before the step (1 x 256 int64), each at its own bytes (the blocks are these rounded up)
    assert made_in_setup == 4 * 494_032_768 + 2 * 32 * 4 + 256 * 8


def test_torchs_own_snapshot_tools_accept_the_models_snapshot(modelled):
    """torch.cuda._memory_viz.segsum (what `python -m torch.cuda._memory_viz segsum` prints) reads every segment and
    block of it: the layout PyTorch's viewer needs (blocks tiling each segment in address order)."""
    raw = pickle.loads(modelled[0].read_bytes())
    text = _memory_viz.segsum(raw)
    assert f"{len(raw['segments'])} segments" in text or "segment" in text
    for seg in raw["segments"]:
        assert seg["total_size"] == sum(b["size"] for b in seg["blocks"])
        addrs = [b["address"] for b in seg["blocks"]]
        assert addrs == sorted(addrs) and addrs[0] == seg["address"]


def test_explain_reads_the_snapshot_and_places_it(modelled):
    s = snapshots.load(modelled[0])
    ex = explain.explain(None, "qwen2.5-0.5b", TrainSetup(seq=256, adam_impl="fused"), snapshot=s, fixes=False)
    assert ex.phase == "step" and ex.phase_from == "snapshot"
    assert ex.snapshot["modelled"] and "modelled: this package's allocator model" in ex.text()
    assert ex.matches                                     # the request named as a buffer of the set-up


def test_cli_explains_a_snapshot(modelled, capsys):
    assert main(["explain", "--snapshot", str(modelled[0]), "--model", "qwen2.5-0.5b", "--seq", "256",
                 "--adam-impl", "fused", "--gpu-gib", "6"]) == 0
    out = capsys.readouterr().out
    assert "allocated blocks by what they are" in out and "optimizer step" in out


def test_older_layouts_are_read():
    seg = {"device": 0, "address": 4096, "total_size": 2 * 2**20, "stream": 0,
           "blocks": [{"size": 2**20, "state": "active_allocated",
                       "history": [{"addr": 4096, "real_size": 1000,
                                    "frames": [{"filename": "train.py", "line": 3, "name": "forward"}]}]},
                      {"size": 2**20, "state": "inactive"}]}
    old = snapshots.from_dict([seg])                                   # torch 1.12: a list of segments
    assert old.format.startswith("torch 1.12") and snapshots.summary(old)["allocated"] == 2**20
    mid = snapshots.from_dict({"segments": [seg], "device_traces": [[]]})    # 1.13-2.0: frames in the history
    assert mid.format.startswith("torch 1.13-2.0") and snapshots.named(mid)[0]["name"] == "activations"


class _Boom:
    def __reduce__(self):
        return (print, ("this must never run",))


@pytest.mark.parametrize("content,words", [
    (pickle.dumps({"segments": [], "x": _Boom()}), "names the Python class builtins.print"),
    (b"CUDA out of memory. Tried to allocate 2.00 GiB", "is not a pickle"),
    (pickle.dumps({"segments": [{"blocks": [{"size": -1, "state": "inactive"}]}]}), "block size must be"),
    (pickle.dumps({"segments": [{"blocks": [{"size": 1, "state": "busy"}]}]}), "state must be one of"),
    (pickle.dumps({"nothing": 1}), "is not a memory snapshot"),
    (pickle.dumps({"segments": []})[:-3], "could not be read as a pickle"),
    (gzip.compress(pickle.dumps([]), mtime=0)[:-8], "broken gzip"),
])
def test_bad_snapshots_are_refused_in_one_line(tmp_path, capsys, content, words):
    f = tmp_path / "s.pickle"
    f.write_bytes(content)
    with pytest.raises(InputError, match=words) as e:
        snapshots.load(f)
    assert "\n" not in str(e.value)
    assert main(["explain", "--snapshot", str(f)]) == 2
    err = capsys.readouterr()
    assert "this must never run" not in err.out + err.err and err.err.count("\n") == 1


def test_a_gzipped_snapshot_is_read(tmp_path, torch_written):
    f = tmp_path / "s.pickle.gz"
    f.write_bytes(gzip.compress(torch_written.read_bytes()))
    assert snapshots.summary(snapshots.load(f))["reserved"] > 0


def test_explain_needs_a_message_or_a_snapshot(capsys):
    assert main(["explain"]) == 2
    assert "--message FILE" in capsys.readouterr().err
    with pytest.raises(InputError):
        explain.explain(None)
    assert GiB == 2**30


def test_a_gzip_that_inflates_past_the_limit_is_refused_without_inflating_it(tmp_path, monkeypatch):
    monkeypatch.setattr(snapshots, "MAX_BYTES", 1_000_000)
    f = tmp_path / "bomb.pickle.gz"
    f.write_bytes(gzip.compress(b"\x80" + b"\0" * 5_000_000))
    with pytest.raises(InputError, match="inflates to over"):
        snapshots.load(f)


def test_a_profiler_snapshot_has_no_reserved_figure(torch_written):
    s = snapshots.load(torch_written)
    assert s.profiler
    text = explain.explain(None, snapshot=s).text()
    assert "no reserved or free figure" in text and "reserved," not in text.split("\n")[0]


def test_a_message_and_a_snapshot_of_different_moments_are_said_so(modelled):
    s = snapshots.load(modelled[0])
    other = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of " \
            "6.00 GiB of which 1.00 MiB is free. Of the allocated memory 4.00 GiB is allocated by PyTorch, and " \
            "1.00 GiB is reserved by PyTorch but unallocated."
    ex = explain.explain(other, snapshot=s)
    assert "not the same moment or run" in ex.text()


def test_a_message_and_the_snapshot_of_its_moment_agree(modelled):
    from helpers.measure.allocator import allocation_size
    from helpers.units import fmt

    s = snapshots.load(modelled[0])
    sm = snapshots.summary(s)
    mib = allocation_size(s.oom["size"]) / 2**20
    same = (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {mib:.2f} MiB. GPU 0 has a total capacity "
            f"of 6.00 GiB of which 1.00 MiB is free. Of the allocated memory {fmt(sm['allocated'], 2)} is allocated by "
            f"PyTorch, and {fmt(sm['cached_free'], 2)} is reserved by PyTorch but unallocated.")
    assert "the same out-of-memory" in explain.explain(same, snapshot=s).text()
