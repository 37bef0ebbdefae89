"""Property-based tests (hypothesis) of the config readers: real upstream files of every format (tests/data/
configs_upstream) written back from their parsed form read the same; and any mutation of one of their values (a wrong
type, a quoted boolean, a huge or negative number, a deleted or misspelt key) ends in a set-up and an estimate, or in
one InputError line naming the file, never another exception.

Bounded: a fixed number of derandomized examples each, no deadline, no example database."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import estimate
from helpers.errors import InputError
from helpers.readers import read

UP = Path(__file__).resolve().parent / "data" / "configs_upstream"
FILES = [  # one or two of each format that read alone
    "axolotl/examples/llama-3/lora-8b.yml",
    "llamafactory/examples/train_full/qwen3_full_sft.yaml",
    "trl/examples/cli_configs/example_config.yaml",
    "torchtune/recipes/configs/llama3_2/1B_lora_single_device.yaml",
    "litgpt/config_hub/finetune/llama-3.2-1B/qlora.yaml",
    "torchtitan/torchtitan/models/llama3/train_configs/llama3_8b.toml",
    "llamafactory/examples/deepspeed/ds_z3_offload_config.json",
    "accelerate/examples/config_yaml_templates/fsdp.yaml",
]
COMPANIONS = {"llamafactory/examples/train_full/qwen3_full_sft.yaml": ["llamafactory/examples/deepspeed/ds_z3_config.json"]}
SCRIPTS = ["openrlhf/examples/scripts/train_sft.sh", "openrlhf/examples/scripts/train_dpo_llama.sh"]
FALLBACK = "llama-3.2-1b"              # for a file that names no model (a DeepSpeed or accelerate file alone)


def bounded(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def parse(path: Path):
    text = path.read_text()
    if path.suffix == ".json":
        return json.loads(text)
    if path.suffix == ".toml":
        import tomllib

        return tomllib.loads(text)
    return yaml.safe_load(text)


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v) if not (isinstance(v, float) and not math.isfinite(v)) else ("nan" if v != v else
                                                                                      ("inf" if v > 0 else "-inf"))
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def dump(data, suffix: str) -> str:
    if suffix == ".json":
        return json.dumps(data, indent=1)
    if suffix == ".toml":
        top = [f"{json.dumps(k)} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
        tables = [f"[{k}]\n" + "\n".join(f"{json.dumps(kk)} = {toml_value(vv)}" for kk, vv in v.items())
                  for k, v in data.items() if isinstance(v, dict)]
        return "\n".join(top + tables) + "\n"
    return yaml.safe_dump(data, sort_keys=False)


def leaves(data, prefix=()):
    if isinstance(data, dict):
        for k, v in data.items():
            yield from leaves(v, prefix + (k,))
    else:
        yield prefix


def outcome(paths) -> str:
    """'ok' (a set-up and an estimate) or 'refused' (one InputError line naming a file given); anything else raises."""
    try:
        imp = read(paths)
        estimate.run(imp.model or FALLBACK, imp.setup)
    except InputError as e:
        msg = str(e)
        assert "\n" not in msg and len(msg) < 1000, msg
        return "refused"
    return "ok"


@pytest.mark.parametrize("name", FILES)
def test_a_file_written_back_from_its_parsed_form_reads_the_same(tmp_path, name):
    path = UP / name
    copy = tmp_path / path.name
    copy.write_text(dump(parse(path), path.suffix))
    more = [UP / c for c in COMPANIONS.get(name, [])]
    a, b = read([path, *more]), read([copy, *more])
    assert (a.model, a.setup) == (b.model, b.setup)
    assert [(s.key, s.value) for s in a.settings] == [(s.key, s.value) for s in b.settings]


JUNK = st.one_of(
    st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
    st.sampled_from(["false", "true", "no", "yes", "0", "1", "off", "auto", "", "  ", "bf16", "fp16", "cpu", "none",
                     "1e9", "-1", "99999999999999999999", "all-linear", "q_proj,v_proj", "$X", "\x00", "é"]),
    st.text(max_size=12), st.lists(st.integers(-5, 5), max_size=3), st.dictionaries(st.text(max_size=4),
                                                                                      st.integers(), max_size=2))


@st.composite
def mutation(draw):
    name = draw(st.sampled_from(FILES))
    data = parse(UP / name)
    paths = list(leaves(data))
    where = draw(st.sampled_from(paths))
    kind = draw(st.sampled_from(["replace", "replace", "replace", "delete", "misspell"]))
    value = draw(JUNK)
    return name, where, kind, value


def apply(data, where, kind, value):
    node = data
    for k in where[:-1]:
        node = node[k]
    key = where[-1]
    if kind == "replace":
        node[key] = value
    elif kind == "delete":
        del node[key]
    else:
        node[str(key)[:-1] + str(key)[-1:] * 2 if str(key) else "x"] = node.pop(key)


@bounded(160)
@given(mutation())
def test_any_mutation_of_a_real_file_is_read_or_refused_in_one_line(tmp_path_factory, m):
    name, where, kind, value = m
    path = UP / name
    data = parse(path)
    apply(data, where, kind, value)
    if path.suffix == ".toml" and value is None and kind == "replace":
        return                                        # TOML has no null
    out = tmp_path_factory.mktemp("m") / path.name
    try:
        text = dump(data, path.suffix)
    except (TypeError, ValueError):
        return                                        # not writable in the format (a dict key TOML cannot hold)
    out.write_text(text)
    assert outcome([out, *(UP / c for c in COMPANIONS.get(name, []))]) in ("ok", "refused")


@bounded(60)
@given(st.sampled_from(SCRIPTS), st.integers(0, 10_000), JUNK)
def test_any_flag_value_of_a_real_script_is_read_or_refused_in_one_line(tmp_path_factory, name, pick, value):
    text = (UP / name).read_text()
    flags = list(re.finditer(r"(--[\w.]+)[ \t]+([^\s\\-][^\s\\]*)", text))
    if not flags:
        return
    f = flags[pick % len(flags)]
    shown = json.dumps(value) if not isinstance(value, str) else value
    mutated = text[:f.start(2)] + (shown.replace("\n", " ") or "''") + text[f.end(2):]
    out = tmp_path_factory.mktemp("s") / Path(name).name
    out.write_text(mutated)
    assert outcome([out]) in ("ok", "refused")


# -- the explorer's API ------------------------------------------------------------------------------------------------

CONTROL_VALUES = st.one_of(st.integers(-3, 70_000), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                           st.none(), st.sampled_from(["bf16", "fsdp2", "zero3", "all-linear", "q,v", "nf4", "x", ""]))
FIELDS = st.sampled_from(["batch", "seq", "gpus", "lora_rank", "lora_dropout", "precision", "strategy", "lora_targets",
                          "tensor_parallel", "offload_optimizer", "base_weights", "gpu_gib", "nosuch"])


@pytest.fixture(scope="module")
def shown():
    from helpers import explore
    from helpers.training import TrainSetup

    return explore.explorer("llama-3.2-1b", TrainSetup(gpu_gib=80))


@bounded(80)
@given(st.dictionaries(FIELDS, CONTROL_VALUES, min_size=1, max_size=2))
def test_any_explorer_set_is_applied_said_or_refused(shown, values):
    """x.set(...) moves the controls to exactly those values, shows why the set-up is invalid, or raises one InputError
    line; a value is never clamped to a slider without a word."""
    try:
        shown.set(**values)
    except InputError as e:
        assert "\n" not in str(e)
        return
    if shown.error:
        assert "\n" not in shown.error and "not a valid set-up" in shown.verdict.value
        return
    for k, v in values.items():
        if k in ("batch", "seq", "gpus") and isinstance(v, int) and not isinstance(v, bool):
            assert getattr(shown.setup, k) == v, (k, v, getattr(shown.setup, k))


def test_explorer_values_off_a_slider_are_reached_not_clamped():
    from helpers import explore
    from helpers.training import TrainSetup

    shown = explore.explorer("llama-3.2-1b", TrainSetup(gpu_gib=80, seq=512))
    shown.set(batch=100)
    assert shown.setup.batch == 100 and shown.controls["batch"].value == 100
    shown.set(batch=0)
    assert "batch must be a positive integer, got 0" in shown.error and shown.controls["batch"].value == 100
