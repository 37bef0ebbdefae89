"""Property-based tests (hypothesis) of issue 17's promise: any command line and any model config ends in a result
or in one line `error: ...` with exit 2; never a traceback, a hang, zero parameters or negative bytes.

Bounded in time: a fixed number of examples each, no per-example deadline (a dry run takes about a second), no
example database; the whole file runs in well under two minutes on two cores."""

import contextlib
import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.__main__ import main
from helpers.training import ATTENTIONS, OPTIMIZERS, PRECISIONS, STRATEGIES

TINY = Path(__file__).parent / "data" / "tiny-llama.json"
def bounded(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])

# values a reader might type: good ones, edge ones, nonsense
JUNK = st.sampled_from(["", "0", "-1", "1e12", "1.5", "abc", "nan", "inf", "-inf", "1e300", "0x10", "true", " 3",
                        "99999999999999999999", "1_000", "-0"])
INTS = st.one_of(st.integers(-3, 70_000).map(str), st.integers(2**20, 2**64).map(str), JUNK)
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.floats(0.01, 2000).map(str), JUNK)


def _choice(values):
    return st.one_of(st.sampled_from(values), st.sampled_from(["", "BF16", "zero4", "x" * 40]))


@st.composite
def command_lines(draw, command="estimate", model="llama-3-8b", small=False):
    argv = [command, "--model", model]
    ints = st.one_of(st.integers(1, 64).map(str), JUNK) if small else INTS
    for flag in ("--batch", "--seq", "--gpus", "--gpus-per-node", "--lora-rank"):
        if draw(st.booleans()):
            argv += [f"{flag}={draw(ints)}"]
    for flag, values in (("--precision", PRECISIONS), ("--strategy", STRATEGIES), ("--attention", ATTENTIONS),
                         ("--optimizer", OPTIMIZERS)):
        if draw(st.booleans()):
            argv += [flag, draw(_choice(values))]
    for flag in ("--gpu-gib", "--host-gib", "--offload-ratio"):
        if draw(st.integers(0, 3)) == 0:
            argv += [f"{flag}={draw(FLOATS)}"]
    for flag in ("--offload-optimizer", "--offload-params", "--pin-memory", "--no-pin-memory", "--grad-checkpointing",
                 "--fused-ce", "--resume", "--items", "--mode", "--mod", "--gpu"):
        if draw(st.integers(0, 4)) == 0:
            argv += [flag]
    return argv + ["--json"]


def run_cli(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)                                  # an exception here is a traceback: the test fails
    return code, out.getvalue(), err.getvalue()


def assert_result_or_one_line_error(argv, code, out, err):
    assert code in (0, 2), (argv, code, err)
    if code == 2:
        assert out == "" and err.startswith("error: ") and err.count("\n") == 1, (argv, err)
        return
    d = json.loads(out)
    assert d["params"] > 0, argv
    assert d["gpu"]["peak_bytes"] > 0, argv
    for dev in ("gpu", "host"):
        assert all(v >= 0 for phase in d[dev]["breakdown"].values() for v in phase.values()), argv


@bounded(150)
@given(command_lines())
def test_any_estimate_command_line(argv):
    assert_result_or_one_line_error(argv, *run_cli(argv))


@bounded(12)
@given(command_lines(command="measure", model=str(TINY), small=True))
def test_any_dry_run_command_line(argv):
    argv = argv + ["--mode", "dry-run", "--no-progress"] if "--mode" not in argv else argv[:-1] + ["--no-progress"]
    assert_result_or_one_line_error(argv, *run_cli(argv))


# model configs: the tiny Llama with fields changed, removed, or of another type --------------------------------
BASE = json.loads(TINY.read_text())
FIELDS = ["hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size", "intermediate_size",
          "num_key_value_heads", "head_dim", "model_type", "tie_word_embeddings"]
VALUES = st.one_of(st.integers(-2, 300), st.sampled_from([2**11, 2**20, 2**21, 2**30, 10**12]),
                   st.floats(allow_nan=True), st.text(max_size=4), st.none(), st.booleans(), st.just([]),
                   st.just("llama"), st.just("t5"))
REMOVED = object()


@st.composite
def configs(draw):
    changes = draw(st.dictionaries(st.sampled_from(FIELDS), st.one_of(VALUES, st.just(REMOVED)), max_size=3))
    cfg = {k: v for k, v in {**BASE, **changes}.items() if v is not REMOVED}
    return draw(st.one_of(st.just(cfg), st.just(cfg), st.just(cfg), st.sampled_from([None, 3, "x", [cfg]])))


def _write(folder: Path, cfg) -> str:
    text = json.dumps(cfg, allow_nan=True)
    path = folder / f"{hashlib.sha1(text.encode()).hexdigest()[:12]}.json"   # one path per content (specs are cached)
    path.write_text(text)
    return str(path)


@bounded(120)
@given(cfg=configs())
def test_any_model_config_estimate(tmp_path_factory, cfg):
    argv = ["estimate", "--model", _write(tmp_path_factory.getbasetemp(), cfg), "--seq", "64", "--json"]
    assert_result_or_one_line_error(argv, *run_cli(argv))


@bounded(12)
@given(cfg=configs())
def test_any_model_config_dry_run(tmp_path_factory, cfg):
    argv = ["measure", "--mode", "dry-run", "--no-progress", "--model", _write(tmp_path_factory.getbasetemp(), cfg),
            "--seq", "16", "--json"]
    assert_result_or_one_line_error(argv, *run_cli(argv))


# and as a user runs it: a process of its own -------------------------------------------------------------------
def test_as_a_process_bad_input_is_one_line_and_exit_2():
    for argv in (["estimate", "--model", "llama-3-8b", "--batch", "1e12"],
                 ["estimate", "--mode", "dry-run", "--model", "llama-3-8b"],
                 ["measure", "--mode", "dry-run", "--model", "llama-3-8b", "--gpus", "65536", "--strategy", "fsdp2"]):
        p = subprocess.run([sys.executable, "-m", "helpers", *argv], capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and p.stdout == "" and p.stderr.startswith("error: "), (argv, p.stderr)
        assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr


def test_as_a_process_json_is_the_whole_stdout():
    p = subprocess.run([sys.executable, "-m", "helpers", "measure", "--mode", "dry-run", "--model", str(TINY),
                        "--seq", "16", "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and json.loads(p.stdout)["params"] > 0
