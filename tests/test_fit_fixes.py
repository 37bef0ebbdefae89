"""fit (the largest batch / sequence that fits), fixes (the ranked ways out) and the CLI's fit, fixes and --from."""

import dataclasses
import json

import pytest

from helpers import cases, estimate, fit, fixes, gpus, report, step_cost, units
from helpers.__main__ import main
from helpers.errors import InputError
from helpers.training import MAX_TOKENS, TrainSetup

MODEL = "llama-3-8b"


def _fits_by_report(r) -> bool:
    """The report's own verdict, read independently of fit.fits: no device over its capacity."""
    return r.oom["device"] is None and report.verdict(r).startswith("fits")


@pytest.mark.parametrize("vary", ["batch", "seq"])
@pytest.mark.parametrize("host_gib", [None, 256])
def test_the_answer_fits_and_one_more_does_not(vary, host_gib):
    setup = cases.setup(1, fixed=True, host_gib=host_gib)          # Llama-3-8B ZeRO-2 with optimizer offload, 80 GiB
    f = fit.largest(MODEL, setup, vary)
    assert f.value > 0 and f.next_value == f.value + f.step
    assert f.step == (1 if vary == "batch" else fit.SEQ_STEP) and f.value % f.step == 0
    again = estimate.run(MODEL, setup.replace(**{vary: f.value}))
    more = estimate.run(MODEL, setup.replace(**{vary: f.next_value}))
    assert _fits_by_report(again) and not _fits_by_report(more)
    assert again.gpu.peak_bytes == f.result.gpu.peak_bytes and more.gpu.peak_bytes == f.next_result.gpu.peak_bytes
    # one more is over on the tensors, or on the device total (the context and cuBLAS's workspaces count with
    # --gpu-gib too)
    assert (more.oom["device"] == "gpu" or report.device_total_oom(more)) and f.why.startswith("OOM on GPU")
    assert 0 < f.estimates <= 2 * 24 + 2                             # doubling, then halving the gap
    assert getattr(f.setup, vary) == f.value


def test_a_host_limit_binds_and_batch_one_too_big_is_value_zero():
    setup = cases.setup(1, fixed=True, host_gib=100)                 # the offloaded states need ~141 GiB of host
    f = fit.largest(MODEL, setup, "batch")
    assert f.value == 0 and f.result is None and f.next_value == 1
    assert f.next_result.oom["device"] == "host"
    assert "at batch 1: OOM on HOST" in f.why and "optimizer_states" in f.why and "GiB" in f.why
    assert f.line().startswith("no micro batch fits")


def test_host_only_capacity_runs_to_the_token_limit():
    setup = cases.setup(1, fixed=True, gpu_gib=None, host_gib=1024)  # no GPU limit: the host does not grow with batch
    f = fit.largest(MODEL, setup, "batch")
    assert f.value == MAX_TOKENS // setup.seq and f.next_value is None and f.next_result is None
    assert "MAX_TOKENS" in f.why and _fits_by_report(f.result)


def test_a_gpu_preset_counts_the_cuda_context_as_the_report_does():
    setup = cases.setup(1, fixed=True, gpu_gib=gpus.preset("a100-80gb")["gib"])
    plain, preset = fit.largest(MODEL, setup, "batch"), fit.largest(MODEL, setup, "batch", gpu="a100-80gb")
    assert preset.value <= plain.value
    parts = gpus.overhead(setup.strategy, setup.gpus, "a100-80gb")
    cap = preset.result.gpu.capacity_bytes
    assert preset.result.gpu.peak_bytes + sum(parts.values()) <= cap
    assert preset.next_result.gpu.peak_bytes + sum(parts.values()) > cap
    assert "CUDA context" in preset.why


@pytest.mark.parametrize("setup, vary, needle", [
    (TrainSetup(), "batch", "fit needs a capacity to fit into"),
    (TrainSetup(gpu_gib=80), "tokens", "vary must be one of batch, seq, got 'tokens'"),
    (TrainSetup(gpu_gib=80, batch=MAX_TOKENS // 32, seq=32), "seq", "batch 524288 leaves no room"),
])
def test_bad_fit_input_is_one_line(setup, vary, needle):
    with pytest.raises(InputError, match=needle) as e:
        fit.largest(MODEL, setup, vary)
    assert "\n" not in str(e.value)


def test_negative_batch_is_refused():
    with pytest.raises(InputError, match="batch must be a positive integer, got -2"):
        fit.largest(MODEL, TrainSetup(batch=-2, gpu_gib=80), "seq")


def test_case_1_fixes_list_optimizer_offload_as_fitting_with_its_host_ram():
    skipped = []
    ways = fixes.ways_out(MODEL, cases.setup(1), skipped=skipped)
    off = next(w for w in ways if w.name == "optimizer offload")
    assert off.fits and off.change == {"offload_optimizer": True}
    base = estimate.run(MODEL, cases.setup(1))
    assert off.host_gib_added == pytest.approx((off.result.host.peak_bytes - base.host.peak_bytes) / 2**30, abs=1e-3)
    assert off.host_gib_added > 100 and 0 < off.pinned_gib_added <= off.host_gib_added + 1
    assert off.step_seconds_added > 0 and "PCIe" in off.cost_basis and "host Adam" in off.cost_basis
    assert "GB/s" in off.cost_basis and "M params/s" in off.cost_basis
    # ranked: fitting first; among them, those with a time before those without
    fits = [w.fits for w in ways]
    assert fits == sorted(fits, reverse=True)
    timed = [w.step_seconds_added is None for w in ways if w.fits]
    assert timed == sorted(timed)
    assert "optimizer offload" in fixes.table(ways) and "yes" in fixes.table(ways)


def test_every_way_out_validates_and_is_the_setup_with_its_change():
    for number in (1, 2, 4, 5):
        setup = cases.setup(number)
        for w in fixes.ways_out(cases.case(number)["model"], setup):
            assert w.setup.validate() == setup.replace(**w.change)
            assert w.peak_gib == pytest.approx(w.result.gpu.peak_bytes / 2**30, abs=1e-3)
            assert w.fits == _fits_by_report(w.result)
            assert w.step_seconds_added is not None or w.cost_basis.startswith("not a matter of step time")


def test_changes_the_registry_refuses_are_skipped_with_the_reason():
    skipped = []
    ways = fixes.ways_out(MODEL, cases.setup(1), skipped=skipped)      # ZeRO-2: no ratio
    assert "offload ratio (smallest that fits)" in {n for n, _ in skipped}
    assert any(w.change.get("optimizer") == "adamw-8bit" for w in ways)   # the Trainer's 8-bit AdamW under ZeRO-2
    skipped = []
    ways = fixes.ways_out(MODEL, cases.setup(1).replace(strategy="zero3"), skipped=skipped)
    assert not any(w.change.get("optimizer") == "adamw-8bit" for w in ways)
    assert any("zero1 and zero2" in why for n, why in skipped if n == "8-bit AdamW")
    skipped = []
    ways = fixes.ways_out("qwen2.5-72b", cases.setup(2), skipped=skipped)   # ZeRO-3: LoRA yes, no 8-bit AdamW
    assert any(n == "8-bit AdamW" for n, _ in skipped) and not any(w.change.get("optimizer") for w in ways)
    assert any("lora_rank" in w.change for w in ways)                        # LoRA under ZeRO-3 is modelled
    ratio = next(w for w in ways if w.name.startswith("offload ratio"))
    assert 0 < ratio.change["offload_ratio"] < 1


def test_checkpointing_costs_the_recomputed_forward():
    setup = TrainSetup(precision="bf16", seq=4096, gpu_gib=24)
    ways = {w.name: w for w in fixes.ways_out(MODEL, setup)}
    full, sel = ways["checkpointing full"], ways["checkpointing selective"]
    m_flops = step_cost.recompute_flops(MODEL, setup.replace(checkpointing="full"))
    assert m_flops > 2 * 4096 * 7e9                   # at least 2 x tokens x the layers' weights
    assert full.step_seconds_added == pytest.approx(m_flops / step_cost.rates().gpu_flops)
    assert 0 < sel.step_seconds_added < full.step_seconds_added
    assert "TFLOPS" in full.cost_basis
    assert full.result.gpu.phases["forward"] < sel.result.gpu.phases["forward"]


def test_no_capacity_for_fixes_is_one_line():
    with pytest.raises(InputError, match="fixes needs a capacity"):
        fixes.ways_out(MODEL, TrainSetup())


# --- the command line --------------------------------------------------------------------------------------------

def run(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


CASE1 = ["--model", MODEL, "--strategy", "zero2", "--seq", "128", "--attention", "flash", "--grad-checkpointing",
         "--gpu-gib", "80"]


def test_cli_fit_and_fixes_print_text_and_json(capsys):
    code, out, _ = run(capsys, "fit", *CASE1, "--offload-optimizer")
    assert code == 0 and "largest micro batch that fits" in out and "largest sequence that fits" in out
    code, out, _ = run(capsys, "fit", *CASE1, "--offload-optimizer", "--vary", "seq", "--json")
    d = json.loads(out)
    assert [f["vary"] for f in d["fit"]] == ["seq"] and d["fit"][0]["value"] % 64 == 0
    assert d["setup"]["offload_optimizer"] is True and set(d["setup"]) == {f.name for f in dataclasses.fields(TrainSetup)}
    code, out, _ = run(capsys, "fixes", *CASE1, "--json")
    d = json.loads(out)
    off = next(w for w in d["ways"] if w["name"] == "optimizer offload")
    assert code == 0 and off["fits"] and off["host_gib_added"] > 100 and d["verdict"].startswith("OOM on GPU")
    code, out, _ = run(capsys, "fixes", *CASE1)
    assert code == 0 and "optimizer offload" in out and "not tried" in out


@pytest.mark.parametrize("args, needle", [
    (["fit", "--model", MODEL], "fit needs a capacity"),
    (["fit", "--model", MODEL, "--gpu-gib", "80", "--vary", "tokens"], "--vary must be one of 'batch', 'seq'"),
    (["fit", "--model", MODEL, "--gpu-gib", "80", "--batch", "-1"], "batch must be a positive integer, got -1"),
    (["fixes", "--gpu-gib", "80"], "the following arguments are required: --model"),
    (["estimate", "--model", MODEL, "--from", "/nonexistent/ds.json"], "/nonexistent/ds.json: no such file"),
])
def test_cli_bad_input_is_one_line(capsys, args, needle):
    code, out, err = run(capsys, *args)
    assert code == 2 and needle in err and err.count("\n") == 1 and not out


TRL_YAML = """model_name_or_path: meta-llama/Meta-Llama-3-8B
per_device_train_batch_size: 4
max_length: 128
gradient_checkpointing: true
bf16: true
"""


@pytest.fixture
def trl(tmp_path):
    """A TRL SFT config (read by the real helpers/readers/trl.py) that names a catalogue model."""
    path = tmp_path / "sft.yaml"
    path.write_text(TRL_YAML)
    return path


def test_cli_from_a_trl_yaml_with_an_overriding_flag(capsys, trl):
    code, out, err = run(capsys, "estimate", "--from", str(trl), "--batch", "2", "--gpu-gib", "80", "--json")
    d = json.loads(out)
    assert code == 0, err
    assert d["model"] == MODEL and d["setup"]["batch"] == 2 and d["setup"]["seq"] == 128
    assert d["setup"]["checkpointing"] == "full"
    imp = d["imported"]
    assert imp["format"] == "trl" and imp["model_named"] == "meta-llama/Meta-Llama-3-8B"
    assert {"key": "per_device_train_batch_size", "line": 2}.items() <= next(
        x for x in imp["settings"] if x["key"] == "per_device_train_batch_size").items()
    over = {o["field"]: o for o in imp["overrides"]}
    assert over["batch"]["flag"] == "--batch" and over["batch"]["replaced"] == 4 and over["batch"]["value"] == 2
    assert over["batch"]["from"].endswith("sft.yaml:2 (per_device_train_batch_size)")
    assert over["gpu_gib"]["from"].startswith("this package's default")
    code, out, _ = run(capsys, "fixes", "--from", str(trl), "--gpu-gib", "40")
    assert code == 0 and "imported (trl)" in out and "sft.yaml:2" in out and "flag (the files do not set it)" in out
    assert "default (transformers" in out and "LoRA rank 8" in out
    code, out, _ = run(capsys, "estimate", "--from", str(trl), "--checkpointing", "selective", "--json")
    over = {o["field"]: o for o in json.loads(out)["imported"]["overrides"]}
    assert code == 0 and over["checkpointing"]["replaced"] == "full" and over["checkpointing"]["value"] == "selective"
    assert over["checkpointing"]["from"].endswith("(gradient_checkpointing)") or "default (" in over["checkpointing"]["from"]


def test_cli_from_a_file_naming_no_known_model_needs_model(capsys, trl):
    trl.write_text(TRL_YAML.replace("meta-llama/Meta-Llama-3-8B", "acme/unknown-7b"))
    code, _, err = run(capsys, "fit", "--from", str(trl), "--gpu-gib", "80")
    assert code == 2 and "names no model the catalogue knows" in err and "pass --model" in err
    assert "acme/unknown-7b" in err and err.count("\n") == 1
    code, out, _ = run(capsys, "fit", "--from", str(trl), "--model", "llama-3.2-1b", "--gpu-gib", "80", "--json")
    d = json.loads(out)
    assert code == 0 and d["model"] == "llama-3.2-1b" and d["setup"]["batch"] == 4
    assert any(o["flag"] == "--model" for o in d["imported"]["overrides"])


# --- --from with the real readers (helpers/readers/deepspeed.py, trl.py + accelerate.py) -------------------------

DS_JSON = """{
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 2,
  "bf16": {"enabled": true},
  "zero_optimization": {
    "stage": 2,
    "offload_optimizer": {"device": "cpu", "pin_memory": true}
  }
}
"""


def test_cli_from_a_deepspeed_json_with_overriding_flags(capsys, tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(DS_JSON)
    code, out, err = run(capsys, "estimate", "--from", str(path), "--model", MODEL, "--batch", "1", "--seq", "128",
                         "--no-pin-memory", "--gpu-gib", "80", "--json")
    assert code == 0, err
    d = json.loads(out)
    s = d["setup"]
    assert s["strategy"] == "zero2" and s["offload_optimizer"] and s["grad_accum"] == 2   # from the file
    assert s["batch"] == 1 and s["seq"] == 128 and s["pin_memory"] is False                # from the flags
    assert set(s) == {f.name for f in dataclasses.fields(TrainSetup)}
    over = {o["field"]: o for o in d["imported"]["overrides"]}
    assert over["batch"]["replaced"] == 4 and over["batch"]["from"].endswith("ds_config.json:2 "
                                                                             "(train_micro_batch_size_per_gpu)")
    assert over["pin_memory"]["flag"] == "--no-pin-memory" and over["pin_memory"]["replaced"] is True
    assert "seq" in over and over["model"]["from"] == "the files name no model"
    assert d["imported"]["format"] == "deepspeed"
    code, out, _ = run(capsys, "fixes", "--from", str(path), "--model", MODEL, "--gpu-gib", "40")
    assert code == 0 and "imported (deepspeed)" in out and "ds_config.json:2" in out
    assert "--gpu-gib" in out and "the files name no model" in out and "optimizer offload" not in out
    code, out, _ = run(capsys, "fit", "--from", str(path), "--model", MODEL, "--gpu-gib", "80", "--json")
    d = json.loads(out)
    assert code == 0 and d["fit"][0]["value"] > 0 and d["setup"]["strategy"] == "zero2"


def test_cli_from_a_deepspeed_json_alone_asks_for_the_model(capsys, tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(DS_JSON)
    code, out, err = run(capsys, "fit", "--from", str(path), "--gpu-gib", "80")
    assert code == 2 and not out and err.count("\n") == 1
    assert "names no model the catalogue knows" in err and "pass --model" in err


def test_one_boundary_search_serves_fit_and_more_gpus():
    calls = []

    def holds(k):
        calls.append(k)
        return k <= 291
    assert fit.boundary(holds, 1, 10**6) == (291, 292) and calls[:10] == [2, 4, 8, 16, 32, 64, 128, 256, 512, 384]
    assert fit.boundary(lambda k: True, 1, 100) == (100, None)
    assert fit.boundary(lambda k: True, 100, 100) == (100, None)


def test_more_gpus_never_proposes_as_many_or_fewer_gpus_than_the_run_has():
    setup = TrainSetup(strategy="zero3", gpus=fixes.MAX_GPUS_TRIED, gpu_gib=1)
    skipped = []
    ways = fixes.ways_out("llama-3-8b", setup, skipped=skipped)
    assert all(w.change.get("gpus", setup.gpus + 1) > setup.gpus for w in ways)
    assert any(name == "more GPUs" and "already has 4096 GPUs" in why for name, why in skipped)


def test_where_no_single_change_fits_the_cheapest_pairs_are_tried():
    """Llama 3.1 70B under FSDP2 on eight 80 GB A100s at 2 x 8192 tokens: no single change fits those GPUs (only more
    of them would); pairs of changes are estimated, and those offered fit, each two changes at once."""
    s = TrainSetup(strategy="fsdp2", gpus=8, seq=8192, batch=2, gpu_gib=gpus.preset("a100-80gb")["gib"])
    ways = fixes.ways_out("llama-3.1-70b", s, gpu="a100-80gb")
    singles = [w for w in ways if " + " not in w.name and not w.name.startswith("more GPUs")]
    pairs = [w for w in ways if " + " in w.name]
    assert singles and not any(w.fits for w in singles)
    assert pairs and all(w.fits and fit.fits(w.result, "a100-80gb")[0] for w in pairs)
    assert all(len(w.name.split(" + ")) == 2 for w in pairs)
    assert ways[0] in pairs                                    # a pair that fits ranks above what does not


def test_ways_that_lower_the_peak_come_before_those_that_hold_more():
    """A set-up that fits as given (Llama 3 8B, ZeRO-2 on four 80 GB GPUs, full checkpointing): selective
    checkpointing is faster and still fits, but holds more; it is ranked after every fitting change that lowers the
    peak, and the table names an unset field as unset (a fresh user's test ranked it first)."""
    s = TrainSetup(strategy="zero2", gpus=4, batch=2, seq=4096, grad_checkpointing=True, gpu_gib=79.15,
                   adam_impl="foreach")
    base = units.to_gib(estimate.run("llama-3-8b", s).gpu.peak_bytes)
    ways = fixes.ways_out("llama-3-8b", s)
    lowers = [w.fits and w.peak_gib <= base - fixes.LOWERS_GIB for w in ways]
    assert lowers == sorted(lowers, reverse=True) and any(lowers)
    selective = next(w for w in ways if w.name == "checkpointing selective")
    assert selective.fits and selective.peak_gib > base and selective.step_seconds_added < 0
    assert ways.index(selective) > max(i for i, x in enumerate(lowers) if x)
    table = fixes.table(ways)
    assert "adam_impl=None" not in table and "strategy=zero3, adam_impl unset" in table


@pytest.mark.parametrize("given,change", [
    (dict(adam_impl="fused"), {"offload_optimizer": True, "adam_impl": None}),
    (dict(adam_impl=None, optimizer="adamw-8bit"), {"offload_optimizer": True, "adam_impl": None,
                                                    "optimizer": "adamw"}),
])
def test_optimizer_offload_is_tried_where_the_trainer_named_its_own_adamw(given, change):
    """The HF Trainer's optimizer under ZeRO (transformers' default adamw_torch_fused) is swapped for DeepSpeedCPUAdam
    when the optimizer is offloaded: the way out is tried as that, not refused for the Trainer's default."""
    s = TrainSetup(strategy="zero2", gpus=8, gpu_gib=40, host_gib=512, **given)
    skipped = []
    ways = {w.name: w for w in fixes.ways_out("llama-3.1-8b", s, skipped=skipped)}
    assert ways["optimizer offload"].change == change
    assert "optimizer offload" not in [name for name, _ in skipped]


def test_a_host_that_runs_out_with_offload_is_offered_offload_off():
    """A user's ZeRO-2 with optimizer offload ran out of host at the save (284 GiB of 256): turning offload off, which
    fits on 80 GiB GPUs, was not among the ways out."""
    s = TrainSetup(strategy="zero2", gpus=8, offload_optimizer=True, adam_impl=None, gpu_gib=80, host_gib=128)
    base = estimate.run("llama-3.1-8b", s)
    assert base.oom["device"] == "host"
    ways = {w.name: w for w in fixes.ways_out("llama-3.1-8b", s)}
    off = ways["offload off (the states back on the GPUs)"]
    assert off.change == {"offload_optimizer": False} and off.fits
    assert off.result.host.peak_bytes < base.host.peak_bytes
    assert "offload off (the states back on the GPUs)" not in {w.name for w in fixes.ways_out(
        "llama-3.1-8b", s.replace(offload_optimizer=False, host_gib=64))}


def test_a_way_out_restates_what_it_makes_inapplicable():
    """A TRL run with its default loss_type ('unset'): the fused cross-entropy way out (use_liger_kernel, where TRL
    takes Liger's loss) is priced, not skipped over the now-moot loss_type (once: "leave one of them unset"); and a
    float32 LoRA base moves to ZeRO-2 as DeepSpeed loads it (load_dtype fp32), not refused."""
    s = TrainSetup(lora_rank=16, trl_loss_type="unset", versions="trl=1.10.0", seq=4096, batch=4, gpu_gib=20)
    skipped = []
    ways = fixes.ways_out("llama-3.2-3b", s, skipped=skipped)
    assert not [w for w in skipped if w[0].startswith("fused cross-entropy")]
    assert any(w.name.startswith("fused cross-entropy") for w in ways)
    moved = s.replace(base_weights="fp32").changed(strategy="zero2", gpus=8)
    assert (moved.base_weights, moved.load_dtype, moved.trl_loss_type) == (None, "fp32", "unset")
    assert s.changed(fused_ce=True).trl_loss_type is None


def test_a_small_offload_ratio_moves_only_the_last_sub_groups_and_is_priced_so():
    """Case 7 (8 ranks of Qwen2.5-7B): each rank's partition is two ZeRO-3 sub-groups, the weights and (OpenRLHF's
    no-decay group) the biases and norm weights; ratio 0.05 moves only the second, so it does not fit, where one
    parameter group (every sub-group moved) did: the under-estimate helper-66 found. A ratio is priced by the
    sub-groups it moves, not by its value."""
    from helpers import deepspeed_rules, models, step_cost

    m, s = models.spec("qwen2.5-7b"), cases.setup(7).replace(offload_optimizer=True, offload_ratio=0.05)
    groups = deepspeed_rules.zero3_sub_groups(m, s)
    assert len(groups) == 2 and deepspeed_rules.first_host_group(2, 0.05) == 1 and groups[1] < 0.001 * groups[0]
    assert estimate.run("qwen2.5-7b", s).oom["device"] == "gpu"
    assert estimate.run("qwen2.5-7b", s.replace(optimizer_groups="one")).oom["device"] is None
    assert step_cost.host_share(m, s) == groups[1] / sum(groups)
    assert step_cost.host_share(m, s.replace(offload_ratio=0.55)) == 1.0      # int(0.45 x 2) = 0: both sub-groups
    ways = fixes.ways_out("qwen2.5-7b", cases.setup(7))
    for w in ways:
        if w.change.get("offload_ratio") is not None:
            assert w.step_seconds_added == next(v.step_seconds_added for v in ways if v.change == {"offload_optimizer": True})


def test_the_ratio_is_said_in_sub_groups_and_no_way_out_repeats_the_current_split():
    """The estimate says which sub-groups a ratio puts on the host (DeepSpeed moves whole ones, from the end), and
    `fixes` offers the smallest ratio of each other split, never one that moves what the set-up already moves."""
    from helpers import models, step_cost

    s = cases.setup(7).replace(offload_optimizer=True, offload_ratio=0.3)
    text = report.table(estimate.run("qwen2.5-7b", s))
    assert "offload ratio 0.3: sub-groups 1..1 of 2 on the host" in text and "optimizer_groups 'decay'" in text
    one = report.table(estimate.run("qwen2.5-7b", s.replace(optimizer_groups="one")))
    assert "offload ratio 0.3: sub-groups 0..0 of 1 on the host" in one and "(100.00%)" in one
    m = models.spec("qwen2.5-7b")
    now = step_cost.host_sub_groups(m, s)[1]
    for w in fixes.ways_out("qwen2.5-7b", s.replace(batch=2)):
        if w.change.get("offload_ratio") is not None:
            assert step_cost.host_sub_groups(m, w.setup)[1] != now, w.change
