"""The HF Trainer's optimizer under DeepSpeed ZeRO (issue: the stack's real defaults). With no `optimizer` block in
the DeepSpeed JSON the Trainer hands DeepSpeed its own `optim`, which then steps over DeepSpeed's flat fp32 partition
(ZeRO-1/2) or each sub-group (ZeRO-3): torch AdamW foreach keeps one fp32 copy of it, for-loop two, bitsandbytes
AdamW8bit keeps 8-bit states of it. Checked against DeepSpeed itself on the tiny twin (a scaled run, real tensors),
and the re-enacted dry run against the estimate (consistency: both follow the same reading of stage_1_and_2.py)."""

from __future__ import annotations

import textwrap

import pytest

from helpers import deepspeed_rules, estimate, models
from helpers.errors import InputError
from helpers.measure import dryrun, scaled
from helpers.readers import read
from helpers.training import TrainSetup

M = "llama-3-8b"


def _twin_estimate(setup: TrainSetup):
    twin, s = scaled.scaled_setup(M, setup)
    return estimate.run(str(twin), s), models.spec(str(twin))


@pytest.mark.parametrize("impl", ["for-loop", "adamw-8bit"])
def test_deepspeed_zero2_with_the_trainers_optimizer_steps_as_estimated(impl):
    """DeepSpeed 0.19.8 ZeRO-2 with a client optimizer, as transformers' deepspeed_optim_sched passes it: the step's
    peak is the estimate's to within 0.1% (the twin's rotary buffers), and for-loop AdamW holds two fp32 copies of
    the whole partition (the partition is one tensor) where FusedAdam holds none."""
    kw = {"optimizer": "adamw-8bit"} if impl == "adamw-8bit" else {"adam_impl": impl}
    setup = TrainSetup(strategy="zero2", batch=2, seq=64, **kw)
    r = scaled.run(M, setup, progress=False)
    assert "client optimizer" in r.meta["engine"]
    e, twin = _twin_estimate(setup)
    assert r.gpu.phases["step"] == pytest.approx(e.gpu.phases["step"], rel=1e-3)
    if impl == "for-loop":
        assert r.gpu.breakdown["step"]["temporaries"] == pytest.approx(2 * 4 * twin.params, rel=1e-3)
    else:        # 8-bit states of one flat partition: 2 bytes per element and an fp32 absmax per 256
        assert r.gpu.breakdown["step"]["optimizer_states"] == e.gpu.breakdown["step"]["optimizer_states"]
        assert r.gpu.breakdown["step"]["optimizer_states"] < 2.1 * twin.params


def test_deepspeed_zero3_foreach_holds_one_sub_group_copy():
    """ZeRO-3 steps each sub-group with its own optimizer.step() (stage3.py _optimizer_step): foreach AdamW's
    _foreach_sqrt copy is one sub-group in fp32, which the scaled run of DeepSpeed shows at the step."""
    setup = TrainSetup(strategy="zero3", batch=2, seq=64, adam_impl="foreach")
    r = scaled.run(M, setup, progress=False)
    e, _ = _twin_estimate(setup)
    assert r.gpu.phases["step"] == pytest.approx(e.gpu.phases["step"], rel=1e-3)
    temp = [i for i in e.items if "foreach temporary over a flat fp32 sub-group" in i["name"]]
    assert len(temp) == 1 and r.gpu.breakdown["step"]["temporaries"] >= temp[0]["bytes"]


@pytest.mark.parametrize("strategy,gpus", [("zero1", 4), ("zero2", 8)])
@pytest.mark.parametrize("impl", [None, "foreach", "for-loop"])
def test_dry_run_of_zero12_agrees_with_the_estimate_at_the_step(strategy, gpus, impl):
    """Consistency: the re-enacted ZeRO-1/2 step (bf16 gradients freed before the update, the second step preparing
    beside the first step's states) and the estimate's items give the same step phase on a full-size model."""
    setup = TrainSetup(strategy=strategy, gpus=gpus, seq=128, adam_impl=impl)
    e = estimate.run("qwen2.5-0.5b", setup)
    d = dryrun.run("qwen2.5-0.5b", setup, progress=False)
    assert d.gpu.phases["step"] == pytest.approx(e.gpu.phases["step"], rel=1e-3)


def test_the_trainers_optimizer_costs_what_its_implementation_keeps():
    """Llama-3-8B on 8 GPUs. ZeRO-2 (bf16-mixed): step() frees its two bf16 copies of the gradient partition before
    the update (4 bytes per partition element), so foreach's one fp32 copy (4 bytes) leaves the step's peak where
    FusedAdam has it, and for-loop's two copies (8 bytes) raise it by one fp32 partition. ZeRO-3 keeps its bf16
    gradient partition: foreach adds its largest sub-group (about sub_group_size, 1e9 elements) in fp32."""
    P = models.spec(M).params
    step = lambda **kw: estimate.run(M, TrainSetup(gpus=8, **kw)).gpu.phases["step"]
    part = -(-P // 8)
    assert step(strategy="zero2", adam_impl="fused") == step(strategy="zero2")
    assert step(strategy="zero2", adam_impl="foreach") == step(strategy="zero2")
    assert step(strategy="zero2", adam_impl="for-loop") - step(strategy="zero2") == 4 * part
    groups = deepspeed_rules.zero3_sub_groups(models.spec(M), TrainSetup(strategy="zero3", gpus=8))
    assert 10**9 <= max(groups) < 1.01 * 10**9           # whole parameters fill a sub-group past sub_group_size
    assert step(strategy="zero3", adam_impl="foreach") - step(strategy="zero3") == 4 * max(groups)


def test_zero3_partial_offload_backup_optimizer_is_foreach_on_the_gpu():
    """offload_optimizer with a ratio keeps the first sub-groups on the GPU, stepped by DeepSpeed's backup
    torch.optim.AdamW (made with no foreach/fused argument: foreach on CUDA), one sub-group copy at the step."""
    s = TrainSetup(strategy="zero3", gpus=8, offload_optimizer=True, offload_ratio=0.5, sub_group_size=10**8)
    e = estimate.run("qwen2.5-72b", s)
    temp = [i for i in e.items if "backup optimizer" in i["name"]]
    groups = deepspeed_rules.zero3_sub_groups(models.spec("qwen2.5-72b"), s)
    on_gpu = groups[:deepspeed_rules.first_host_group(len(groups), 0.5)]
    assert len(temp) == 1 and temp[0]["bytes"] == 4 * max(on_gpu) and temp[0]["device"] == "gpu"
    assert "stage3.py" in temp[0]["why"] and "step" in temp[0]["phases"]
    none_on_gpu = estimate.run("qwen2.5-72b", s.replace(offload_ratio=None))
    assert not [i for i in none_on_gpu.items if "backup optimizer" in i["name"]]


@pytest.mark.parametrize("changes,words", [
    ({"adam_impl": "foreach", "offload_optimizer": True}, ["DeepSpeedCPUAdam", "leave adam_impl unset"]),
    ({"optimizer": "adamw-8bit", "offload_optimizer": True}, ["DeepSpeedCPUAdam", "map_pytorch_optim_to_deepspeed"]),
])
def test_a_client_optimizer_with_offload_is_refused_in_one_line(changes, words):
    with pytest.raises(InputError) as exc:
        TrainSetup(strategy="zero2", **changes).validate()
    assert "\n" not in str(exc.value) and all(w in str(exc.value) for w in words)


def test_8bit_under_zero3_is_refused_naming_where_it_is_modelled():
    with pytest.raises(InputError, match="zero1 and zero2"):
        TrainSetup(strategy="zero3", optimizer="adamw-8bit").validate()


# --- readers: who steps the run -------------------------------------------------------------------------------------

def _files(tmp_path, optim: str | None, ds: str) -> list:
    run = tmp_path / "run.yaml"
    run.write_text(textwrap.dedent("""\
        model_name_or_path: meta-llama/Meta-Llama-3-8B
        stage: sft
        finetuning_type: full
        deepspeed: ds.json
        cutoff_len: 1024
        per_device_train_batch_size: 1
        bf16: true
        """) + (f"optim: {optim}\n" if optim else ""))
    (tmp_path / "ds.json").write_text(ds)
    return [run, tmp_path / "ds.json"]


Z3 = '"zero_optimization": {"stage": 3}'
Z3_OFFLOAD = '"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}'
BLOCK = '"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}'


@pytest.mark.parametrize("optim,ds,expected", [
    ("adamw_torch", "{" + Z3 + "}", {"adam_impl": "foreach", "optimizer": "adamw"}),
    ("adamw_bnb_8bit", '{"zero_optimization": {"stage": 2}}', {"adam_impl": None, "optimizer": "adamw-8bit"}),
    ("adamw_torch", "{" + Z3 + ", " + BLOCK + "}", {"adam_impl": None, "optimizer": "adamw"}),
    ("adamw_torch", "{" + Z3_OFFLOAD + "}", {"adam_impl": None, "optimizer": "adamw"}),
    (None, "{" + Z3 + "}", {"adam_impl": "fused", "optimizer": "adamw"}),     # torch >= 2.8: adamw_torch_fused
])
def test_llamafactory_with_deepspeed_reads_who_steps(tmp_path, optim, ds, expected):
    imported = read(_files(tmp_path, optim, ds))
    assert {k: getattr(imported.setup, k) for k in expected} == expected
    optim_entry = [x for x in imported.settings + imported.defaults if x.key == "optim"]
    assert len(optim_entry) == 1
    if expected["adam_impl"] is None and expected["optimizer"] == "adamw":
        assert optim_entry[0].sets.startswith("nothing:")


def test_deepspeed_torch_adam_is_torch_adamw(tmp_path):
    ds = '{"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "params": {"torch_adam": true}}}'
    imported = read(_files(tmp_path, "adamw_torch_fused", ds))
    assert imported.setup.adam_impl == "foreach"        # DeepSpeed passes foreach=None: torch's CUDA default


def test_axolotl_hands_its_optimizer_to_deepspeed(tmp_path):
    (tmp_path / "ds.json").write_text("{" + Z3 + "}")
    run = tmp_path / "axolotl.yaml"
    run.write_text("base_model: meta-llama/Meta-Llama-3-8B\nsequence_len: 1024\nmicro_batch_size: 1\nbf16: true\n"
                   "deepspeed: ds.json\noptimizer: adamw_torch\n")
    imported = read([run, tmp_path / "ds.json"])
    assert imported.setup.strategy == "zero3" and imported.setup.adam_impl == "foreach"
