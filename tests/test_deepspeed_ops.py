"""DeepSpeed without its C++ ops: the torch_adam path trains the twin with the same buffers, and says so; a build
announces itself, with its expected time, before it starts; a partial offload, which needs the C++ op, is refused."""

import pytest
from test_scaled import M, falls, twin_params, within_10_percent_of_estimate

from helpers import deepspeed_ops
from helpers.errors import InputError
from helpers.measure import scaled
from helpers.training import TrainSetup


@pytest.mark.parametrize("offload", [False, True])
def test_torch_adam_path_needs_no_build_and_keeps_the_buffers(monkeypatch, offload):
    monkeypatch.setenv("OOM_DEEPSPEED_OPS", "torch")
    monkeypatch.setattr(deepspeed_ops, "ensure", lambda op: pytest.fail(f"asked for the C++ op {op}"))
    setup = TrainSetup(strategy="zero2", batch=2, seq=64, offload_optimizer=offload)
    r = scaled.run(M, setup)
    P = twin_params()
    assert falls(r.meta["losses"])
    assert "torch_adam" in r.meta["engine"] and ("DeepSpeedCPUAdam" if offload else "FusedAdam") in r.meta["engine"]
    states = (r.host if offload else r.gpu).breakdown["step"]
    assert states["master_weights"] == 4 * P and states["optimizer_states"] == 8 * P
    within_10_percent_of_estimate(r, M, setup)


def test_no_compiler_takes_the_torch_path_and_ratio_is_refused(monkeypatch):
    monkeypatch.delenv("OOM_DEEPSPEED_OPS", raising=False)
    monkeypatch.setattr(deepspeed_ops, "compiler", lambda: None)
    monkeypatch.setattr(deepspeed_ops, "build_dir", lambda op: deepspeed_ops.Path("/nonexistent") / op)
    assert deepspeed_ops.status("cpu_adam") == "no compiler"
    assert deepspeed_ops.torch_path(offload=True)
    with pytest.raises(InputError, match=r"\(offload_ratio 0.9\) runs only with DeepSpeedCPUAdam.*no C\+\+ compiler"):
        deepspeed_ops.torch_path(offload=True, ratio=0.9)
    lines = deepspeed_ops.prepare(["cpu_adam"])
    assert "torch_adam" in lines[0] and "no C++ compiler" in lines[0]


def test_bad_policy_is_one_line(monkeypatch):
    monkeypatch.setenv("OOM_DEEPSPEED_OPS", "maybe")
    with pytest.raises(InputError, match="OOM_DEEPSPEED_OPS must be one of auto, build, torch, got 'maybe'"):
        deepspeed_ops.policy()


def test_a_missing_op_is_announced_with_its_time_before_the_build(monkeypatch, tmp_path, capsys):
    """The notice comes first; the build itself (minutes) is replaced by a process that ends at once. The extensions
    folder does not exist yet, as on a machine that has never built one: its build log still has a place."""
    monkeypatch.delenv("OOM_DEEPSPEED_OPS", raising=False)
    monkeypatch.setattr(deepspeed_ops, "build_dir", lambda op: tmp_path / "never-built" / op)
    monkeypatch.setattr(deepspeed_ops, "compiler", lambda: "/usr/bin/c++")
    (tmp_path / "timings.json").write_text('{"builds": {"cpu_adam": {"seconds": 183.0}}}')
    monkeypatch.setattr(deepspeed_ops, "TIMINGS", tmp_path / "timings.json")
    started = []
    monkeypatch.setattr(deepspeed_ops, "_command", lambda ops: started.append(ops) or ["true"])
    monkeypatch.setattr(deepspeed_ops, "_background", {})
    lines = deepspeed_ops.prepare(["cpu_adam"])
    assert lines[0].startswith("Building DeepSpeed's cpu_adam (DeepSpeedCPUAdam, C++) once: about 3 min")
    assert "183 s" in lines[0] and started == [["cpu_adam"]]
    assert capsys.readouterr().out.splitlines()[0] == lines[0]
    assert (tmp_path / "never-built" / "oom-casebook-build.log").is_file()


@pytest.mark.skipif(not deepspeed_ops.sys.platform.startswith("linux"), reason="the torch-free rule is Linux's")
@pytest.mark.parametrize("extensions_dir", [None, "/tmp/some-extensions"])
def test_build_dir_without_torch_is_torchs_own(monkeypatch, extensions_dir):
    from torch.utils.cpp_extension import _get_build_directory

    if extensions_dir is None:
        monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    else:
        monkeypatch.setenv("TORCH_EXTENSIONS_DIR", extensions_dir)
    for op in deepspeed_ops.OPS:
        assert deepspeed_ops._linux_build_dir(op) == deepspeed_ops.Path(_get_build_directory(op, verbose=False))


@pytest.mark.parametrize("record", [False, True])
def test_a_build_records_its_time_only_when_asked(monkeypatch, tmp_path, record):
    """A just-in-time build (a notebook's first cell, a test, `make lab`) leaves the tracked timings file alone;
    `build --record` writes it. The build itself is replaced by a builder whose load() returns at once."""
    import types

    class Builder:
        def load(self):
            return None

    fake = types.SimpleNamespace(op_builder=types.SimpleNamespace(CPUAdamBuilder=Builder, FusedAdamBuilder=Builder))
    monkeypatch.setitem(deepspeed_ops.sys.modules, "deepspeed", types.ModuleType("deepspeed"))
    monkeypatch.setitem(deepspeed_ops.sys.modules, "deepspeed.ops", fake)
    timings = tmp_path / "timings.json"
    timings.write_text('{"builds": {"cpu_adam": {"seconds": 183.0}}}')
    monkeypatch.setattr(deepspeed_ops, "TIMINGS", timings)
    monkeypatch.setattr(deepspeed_ops, "status", lambda op: "buildable")
    monkeypatch.setattr(deepspeed_ops, "compiler", lambda: "/usr/bin/c++")
    assert deepspeed_ops.main(["build", "cpu_adam"] + (["--record"] if record else [])) == 0
    seconds = deepspeed_ops.json.loads(timings.read_text())["builds"]["cpu_adam"]["seconds"]
    assert (seconds != 183.0) is record
