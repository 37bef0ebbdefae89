"""DeepSpeed's C++ Adam ops on this machine: already built, built now (with a notice first), or not needed.

DeepSpeed builds its optimizer kernels just in time, the first time an engine asks for them
(deepspeed 0.19.8, ops/op_builder/builder.py `OpBuilder.load` -> `jit_load` -> torch.utils.cpp_extension.load), and
torch caches each in TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions/pyXY_cpu/NAME/NAME.so). A build needs a
C++ compiler (`CXX`, else `c++`) and ninja, and takes minutes on a laptop; DeepSpeed prints nothing until it ends.

DeepSpeed also has torch-based paths that need no build: `"torch_adam": true` in the optimizer's parameters makes
its engine create torch.optim.AdamW instead of FusedAdam or DeepSpeedCPUAdam (runtime/engine.py,
`get_optimizer_configuration`), and ZeRO's offload then runs that AdamW on the host partitions. Only the partial
offload (`ratio`) refuses it ("Hybrid Optimizer Only Supports DeepSpeedCPUAdam").

OOM_DEEPSPEED_OPS chooses: `auto` (default: a built op is used; a missing one is built where a compiler exists, the
torch path taken otherwise), `build` (always the C++ op), `torch` (never build: the torch path).
`python -m helpers.deepspeed_ops build` builds both ops ahead (`make lab` does); with `--record` it also records each
build's time in data/results/deepspeed_op_builds.json, which the notice quotes. Builds made just in time (a notebook's
first cell, a test) or by `make lab` record nothing: running the project leaves no tracked file changed.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from helpers import files
from helpers.errors import InputError

OPS = {"cpu_adam": ("CPUAdamBuilder", "DeepSpeedCPUAdam"), "fused_adam": ("FusedAdamBuilder", "FusedAdam")}
POLICIES = ("auto", "build", "torch")
TIMINGS = Path(__file__).resolve().parents[1] / "data" / "results" / "deepspeed_op_builds.json"
_background: dict[str, subprocess.Popen] = {}


def policy() -> str:
    """OOM_DEEPSPEED_OPS, checked: auto, build or torch."""
    value = os.environ.get("OOM_DEEPSPEED_OPS", "auto").strip().lower() or "auto"
    if value not in POLICIES:
        raise InputError(f"OOM_DEEPSPEED_OPS must be one of {', '.join(POLICIES)}, got {value!r}")
    return value


def op_for(offload: bool) -> str:
    """The op a DeepSpeed engine asks for: DeepSpeedCPUAdam with an optimizer offload, FusedAdam without."""
    return "cpu_adam" if offload else "fused_adam"


def build_dir(op: str) -> Path:
    """Where torch keeps (or would keep) the built op: torch's own `_get_build_directory` once torch is imported; before
    that, on Linux, the same rule read without importing torch (a notebook's first line comes out in seconds):
    TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions/py<major><minor><abiflags>_<cpu|cuXYZ|rocmXYZ>
    (torch 2.13, torch/utils/cpp_extension.py; tests/test_deepspeed_ops.py checks the two agree)."""
    if "torch" in sys.modules or not sys.platform.startswith("linux"):
        from torch.utils.cpp_extension import _get_build_directory

        return Path(_get_build_directory(op, verbose=False))
    return _linux_build_dir(op)


def _linux_build_dir(op: str) -> Path:
    """torch's build-directory rule on Linux, without importing torch."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        version = _torch_version_fields()
        accel = (f"rocm{version['hip'].replace('.', '')}" if version.get("hip")
                 else f"cu{version['cuda'].replace('.', '')}" if version.get("cuda") else "cpu")
        py = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
        root = os.path.join(os.path.realpath(os.path.join(cache, "torch_extensions")), f"{py}_{accel}")
    return Path(root) / op


def _torch_version_fields() -> dict:
    """`cuda` and `hip` from torch/version.py, read as text (torch not imported)."""
    found = _constants("torch", "version.py")
    return {k: found[k] for k in ("cuda", "hip") if k in found}


def _constants(package: str, filename: str) -> dict:
    """The literal top-level assignments of `filename` in an installed `package`, read as text (nothing imported);
    {} when the package or the file is missing. A value that is not a literal is left out."""
    spec = importlib.util.find_spec(package)
    path = Path(spec.origin).parent / filename if spec and spec.origin else None
    if path is None or not path.exists():
        return {}
    out = {}
    for node in ast.parse(path.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and node.value is not None:
            try:
                out[target.id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return out


def compiler() -> str | None:
    """The C++ compiler torch would call, if it and ninja are on PATH."""
    cxx = shutil.which(os.environ.get("CXX", "c++"))
    ninja = shutil.which("ninja") or shutil.which("ninja", path=str(Path(sys.executable).parent))
    return cxx if cxx and ninja else None


def status(op: str) -> str:
    """'built' (cached by torch or installed prebuilt with DeepSpeed), 'buildable' (a compiler exists) or 'no compiler'."""
    if op not in OPS:
        raise InputError(f"unknown DeepSpeed op {op!r}: allowed are {', '.join(OPS)}")
    if _installed(op) or (build_dir(op) / f"{op}.so").exists():
        return "built"
    return "buildable" if compiler() else "no compiler"


def _installed(op: str) -> bool:
    """Whether DeepSpeed was installed with `op` prebuilt (DS_BUILD_OPS), read from the file its setup.py writes,
    without importing deepspeed (seconds, and a warning, on a CPU-only machine)."""
    ops = _constants("deepspeed", "git_version_info_installed.py").get("installed_ops")
    return bool(ops.get(op)) if isinstance(ops, dict) else False


def torch_path(offload: bool, ratio: float | None = None) -> bool:
    """True when a DeepSpeed run should take DeepSpeed's torch_adam path instead of building or loading its C++ Adam."""
    op, how = op_for(offload), policy()
    if how == "build" or (how == "auto" and status(op) != "no compiler"):
        return False
    if ratio is not None:
        reason = ("OOM_DEEPSPEED_OPS=torch declines the build: unset it" if how == "torch"
                  else "no C++ compiler (c++ and ninja) is on PATH: install one")
        raise InputError(f"a partial offload (offload_ratio {ratio}) runs only with DeepSpeedCPUAdam, a C++ op that "
                         f"must be built, and {reason}")
    return True


def expected_s(op: str) -> float | None:
    """How long the last recorded build of `op` took on this kind of machine (seconds), if one was recorded."""
    try:
        return float(json.loads(TIMINGS.read_text())["builds"][op]["seconds"])
    except (OSError, KeyError, ValueError, TypeError):
        return None


def notice(op: str) -> str:
    """One line: what is about to be built, how long it takes, and how to avoid it."""
    took = expected_s(op)
    when = (f"about {took / 60:.0f} min (it took {took:.0f} s on a {os.cpu_count()}-core CPU here)" if took
            else "several minutes")
    return (f"Building DeepSpeed's {op} ({OPS[op][1]}, C++) once: {when}; cached in {build_dir(op)}. "
            f"OOM_DEEPSPEED_OPS=torch skips it (DeepSpeed's torch_adam path).")


def _command(ops: list[str]) -> list[str]:
    return [sys.executable, "-m", "helpers.deepspeed_ops", "build", *ops]


def prepare(ops=tuple(OPS)) -> list[str]:
    """For a notebook's first cell: say which ops its DeepSpeed runs use and how, and start building the missing
    ones in the background (a lower-priority process) so the build overlaps the cells before them. Returns the lines."""
    how = policy()
    lines, missing = [], []
    for op in ops:
        st = status(op)
        if st == "built":
            lines.append(f"DeepSpeed's {op} ({OPS[op][1]}): built")
        elif how == "torch" or (how == "auto" and st == "no compiler"):
            why = "OOM_DEEPSPEED_OPS=torch" if how == "torch" else "no C++ compiler here"
            lines.append(f"DeepSpeed's {op}: not built, {why}: DeepSpeed runs use its torch_adam path (torch AdamW)")
        else:
            missing.append(op)
            lines.append(notice(op) + " Started now, in the background.")
    if missing and not any(p.poll() is None for p in _background.values()):
        logs = build_dir(missing[0]).parent        # absent on a machine that has never built a torch extension
        logs.mkdir(parents=True, exist_ok=True)
        log = open(logs / "oom-casebook-build.log", "w")
        cmd = (["nice", "-n", "5"] if shutil.which("nice") else []) + _command(missing)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        for op in missing:
            _background[op] = proc
    for line in lines:
        print(line, flush=True)
    return lines


def ensure(op: str) -> None:
    """Before an engine asks DeepSpeed for `op`: if it still has to be built, say so (one line, with its expected
    time) and build it here with a progress bar; a build started by `prepare` is waited for."""
    if status(op) == "built" or policy() == "torch":
        return
    if status(op) == "no compiler":
        raise InputError(f"DeepSpeed's {op} must be built and no C++ compiler (c++ and ninja) is on PATH: install "
                         f"one, or set OOM_DEEPSPEED_OPS=torch (DeepSpeed's torch_adam path)")
    proc = _background.get(op)
    if proc is None or proc.poll() is not None:
        print(notice(op), flush=True)
        proc = subprocess.Popen(_command([op]), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, text=True)
    else:
        print(f"Waiting for the background build of DeepSpeed's {op} (started by the first cell).", flush=True)
    _wait(proc, op)
    if status(op) != "built":
        raise RuntimeError(f"DeepSpeed's {op} did not build (exit {proc.returncode}); its log: "
                           f"{build_dir(op).parent / 'oom-casebook-build.log'} or the output above")


def _wait(proc: subprocess.Popen, op: str) -> None:
    """A progress bar in seconds against the expected build time until `proc` ends."""
    from tqdm.auto import tqdm

    total = expected_s(op)
    started = time.monotonic()
    with tqdm(total=round(total) if total else None, desc=f"building {op}", unit="s", leave=False) as bar:
        while proc.poll() is None:
            time.sleep(1)
            done = round(time.monotonic() - started)
            bar.update(min(done, bar.total or done) - bar.n)
    if proc.returncode and proc.stderr is not None:
        print(proc.stderr.read()[-2000:], file=sys.stderr)


def build(ops: list[str], record_times: bool = False) -> dict:
    """Build `ops` now, in this process, each timed; with `record_times`, the times written to
    data/results/deepspeed_op_builds.json (a maintainer's step, `build --record`)."""
    from deepspeed.ops import op_builder

    from helpers import provenance

    record = {"builds": {}}
    try:
        record = json.loads(TIMINGS.read_text())
    except (OSError, ValueError):
        pass
    for op in ops:
        if status(op) == "built":
            print(f"DeepSpeed's {op}: already built ({build_dir(op)})", flush=True)
            continue
        print(notice(op), flush=True)
        started = time.perf_counter()
        getattr(op_builder, OPS[op][0])().load()
        seconds = time.perf_counter() - started
        print(f"DeepSpeed's {op}: built in {seconds:.0f} s", flush=True)
        record.setdefault("builds", {})[op] = {
            "seconds": round(seconds, 1), "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "device": f"CPU ({platform.machine()}, {os.cpu_count()} cores)", "versions": provenance.versions()}
    if record_times and record.get("builds"):
        try:
            files.write_text_atomically(TIMINGS, json.dumps(record, indent=1) + "\n")
        except OSError:                  # a read-only checkout still gets its ops built
            pass
    return record


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m helpers.deepspeed_ops",
                                description="Build DeepSpeed's C++ Adam ops ahead, or show their status.")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the ops (default: both), each timed")
    b.add_argument("ops", nargs="*", help=f"any of {', '.join(OPS)}")
    b.add_argument("--record", action="store_true", help="write the times to data/results/deepspeed_op_builds.json "
                                                         "(the notice's expected time)")
    sub.add_parser("status", help="built, buildable or no compiler, for each op")
    a = p.parse_args(argv)
    if a.command == "status":
        for op in OPS:
            print(f"{op}: {status(op)} ({build_dir(op)})")
        return 0
    bad = [op for op in getattr(a, "ops", []) if op not in OPS]
    if bad:
        print(f"error: op must be one of {', '.join(OPS)}, got {bad[0]!r}", file=sys.stderr)
        return 2
    if compiler() is None:
        print("error: no C++ compiler (c++ and ninja) on PATH: DeepSpeed runs will use its torch_adam path instead",
              file=sys.stderr)
        return 2
    build(a.ops or list(OPS), record_times=a.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
