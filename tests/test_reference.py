"""DPO (helpers.estimate.reference): the reference model placed per engine (measured on DeepSpeed's real engine as
TRL prepares it), the pairs of sequences and the log-probabilities' logits against a dry run of TRL's step
re-enacted (helpers.measure.dryrun.DPOStep, DPOZeroStep) and against the twin trained for real through torch and
DeepSpeed with the same loss (helpers.measure.preference_loss), the options' one-line refusals, and the readers that
set them."""

import math

import pytest

from helpers import estimate, models, readers, report
from helpers.errors import InputError
from helpers.measure import dryrun, scaled
from helpers.measure import reference as measured_reference
from helpers.training import TrainSetup
from helpers.units import MiB

M8 = models.spec("llama-3.1-8b")
P8 = M8.params


def _ref(r, device="gpu"):
    return sum(i["bytes"] for i in r.items if i["name"].startswith("reference model") and i["device"] == device)


def _sharded(n):
    return sum(-(-t.numel // n) for t in M8.tensors)


@pytest.mark.parametrize("strategy, gpus, extra, expect", [
    ("single", 1, {}, 4 * P8),                          # TRL loads the copy in float32, kept as loaded
    ("single", 1, {"precision": "bf16"}, 2 * P8),       # a bf16 model_init_kwargs: as loaded
    ("ddp", 8, {}, 4 * P8),
    ("zero2", 8, {}, 2 * P8),                           # ZeRO stage 0: the whole copy in bf16 on every GPU
    ("zero1", 8, {}, 2 * P8),
    ("zero3", 8, {}, 2 * _sharded(8)),                  # partitioned like the policy
    ("fsdp2", 8, {}, 4 * _sharded(8)),                  # sharded in the dtype it was loaded in
])
def test_the_reference_model_is_placed_as_each_engine_prepares_it(strategy, gpus, extra, expect):
    r = estimate.run("llama-3.1-8b", TrainSetup(run="dpo", strategy=strategy, gpus=gpus, **extra))
    assert _ref(r) == expect
    sft = estimate.run("llama-3.1-8b", TrainSetup(strategy=strategy, gpus=gpus, **extra))
    assert r.gpu.phases["setup"] - sft.gpu.phases["setup"] == expect      # from set-up on, the copy and only it


def test_lora_and_precomputed_runs_hold_no_copy_but_openrlhfs_lora_does():
    lora = TrainSetup(run="dpo", lora_rank=16)
    assert lora.ref == "adapters-off" and _ref(estimate.run("llama-3.1-8b", lora)) == 0
    assert _ref(estimate.run("llama-3.1-8b", TrainSetup(run="dpo", reference="none"))) == 0
    copy = estimate.run("llama-3.1-8b", TrainSetup(run="dpo", lora_rank=16, reference="copy", strategy="zero2", gpus=8))
    assert _ref(copy) == 2 * P8


def test_zero3_with_offloaded_parameters_keeps_the_references_partitions_on_the_host():
    s = TrainSetup(run="dpo", strategy="zero3", gpus=8, offload_params=True, offload_optimizer=True)
    r = estimate.run("llama-3.1-8b", s)
    assert _ref(r) == 0 and _ref(r, "host") == 8 * 2 * _sharded(8)      # x8 ranks of the node


def test_the_reference_is_converted_beside_the_policy_while_an_engine_loads_it():
    fsdp = estimate.run("llama-3.1-8b", TrainSetup(run="dpo", strategy="fsdp2", gpus=8))
    sft = estimate.run("llama-3.1-8b", TrainSetup(strategy="fsdp2", gpus=8))
    assert fsdp.host.phases["setup"] == 2 * sft.host.phases["setup"] == 2 * 8 * 4 * P8
    single = estimate.run("llama-3.1-8b", TrainSetup(run="dpo"))   # the Trainer moved the policy to its GPU first
    assert single.host.phases["setup"] == estimate.run("llama-3.1-8b", TrainSetup()).host.phases["setup"]


def test_a_checkpoint_saves_the_policy_not_the_reference():
    r = estimate.run("qwen2.5-0.5b", TrainSetup(run="dpo"))
    written = [i for i in r.meta["saving"] if i["name"].startswith("model written")][0]
    assert written["bytes"] == models.spec("qwen2.5-0.5b").params * 4


@pytest.mark.parametrize("model, options", [
    ("qwen2.5-0.5b", {}),
    ("qwen2.5-0.5b", {"checkpointing": "full", "lora_rank": 8}),
    ("qwen2.5-0.5b", {"reference": "none", "precision": "fp32"}),
    ("gemma-2-2b", {"checkpointing": "full"}),                       # soft-capped logits, a tied head
    ("qwen2.5-0.5b", {"dpo_logps": "log-softmax"}),                  # LLaMA-Factory's get_batch_logps
    ("qwen2.5-0.5b", {"dpo_logps": "log-softmax", "reference": "none", "strategy": "ddp", "gpus": 4}),
])
def test_dpo_estimate_agrees_with_a_dry_run_of_trls_step_per_phase(model, options):
    """The policy over chosen + rejected, the reference's forward, the log-probabilities and their backward, each a
    dry run of the real step on fake tensors at full size; within 1% per phase (measured: within 0.2%)."""
    s = TrainSetup(run="dpo", **options)
    d = dryrun.run(model, s, progress=False)
    e = estimate.run(model, s, lifecycle=False)
    for phase, measured in d.gpu.phases.items():
        assert abs(e.gpu.phases[phase] / measured - 1) < 0.01, (phase, e.gpu.phases[phase], measured)
    E = 2 * s.batch * s.seq * models.spec(model).vocab
    if not options:      # the policy's fp32 logits + 12 E of gradients in backward, as the docstring says
        assert abs(d.gpu.breakdown["backward"]["logits"] / (16 * E) - 1) < 0.01
    if options == {"dpo_logps": "log-softmax"}:   # two logits and two log_softmax outputs at the reference's scoring
        assert abs(d.gpu.breakdown["forward"]["logits"] / (16 * E) - 1) < 0.01


def test_a_sharded_dpo_gpu_run_or_a_torchrun_scaled_run_is_refused_rather_than_measured_as_sft():
    from helpers.measure import engines

    with pytest.raises(InputError, match="a DPO gpu run trains one GPU in one process .strategy 'single'., got "
                                         "strategy 'zero2'"):
        engines.refuse_unsupported(TrainSetup(run="dpo", strategy="zero2", gpus=2), "gpu")
    with pytest.raises(InputError, match="run 'grpo' has no gpu run here"):      # TRL's GRPO: its loss not re-enacted
        engines.refuse_unsupported(TrainSetup(run="grpo"), "gpu")
    with pytest.raises(InputError, match="a DPO scaled run trains in this process"):
        engines.refuse_unsupported(TrainSetup(run="dpo", strategy="fsdp2", gpus=2), "scaled")
    for mode in ("dry", "scaled", "gpu"):
        engines.refuse_unsupported(TrainSetup(run="dpo"), mode)


def test_a_dpo_dry_run_of_a_sharding_engine_is_refused_in_one_line():
    with pytest.raises(InputError, match="a DPO dry run exists for single, ddp, zero1 and zero2"):
        dryrun.run("qwen2.5-0.5b", TrainSetup(run="dpo", strategy="fsdp2", gpus=8), progress=False)


@pytest.mark.parametrize("options", [
    dict(strategy="zero2", gpus=8, batch=2, seq=1024),
    dict(strategy="zero1", gpus=4, batch=1, seq=2048),
    dict(strategy="zero2", gpus=8, batch=2, seq=1024, lora_rank=16),
    dict(strategy="zero2", gpus=2, batch=1, seq=1024, dpo_logps="log-softmax"),
], ids=["zero2", "zero1", "zero2-lora", "zero2-llamafactory"])
def test_dpo_under_deepspeed_agrees_with_a_dry_run_of_its_16_bit_logits(options):
    """Under DeepSpeed accelerate wraps no native-amp forward: TRL's logits stay bf16 and its selective_log_softmax
    takes a log_softmax per sequence (LLaMA-Factory's casts them to fp32 itself). Counted in fp32 as before, the
    estimate was 72% over the dry run's backward (zero2); now every phase within 0.5% and none under by 2 MiB. At the
    reference's scoring the policy's bf16 logits, both references' (2 E each, E = 2 x batch x seq x vocab) and the
    policy's kept log_softmax (about 2 E) are alive; in backward the stacked gradient and the slice's (2 E each)."""
    s = TrainSetup(run="dpo", **options)
    d = dryrun.run("qwen2.5-0.5b", s, progress=False)
    e = estimate.run("qwen2.5-0.5b", s, lifecycle=False)
    for phase, measured in d.gpu.phases.items():
        assert abs(e.gpu.phases[phase] / measured - 1) < 0.005 and e.gpu.phases[phase] > measured - 2 * MiB, \
            (phase, e.gpu.phases[phase], measured)
    if options.get("dpo_logps") is None:
        E = 2 * s.batch * s.seq * models.spec("qwen2.5-0.5b").vocab
        assert abs(d.gpu.breakdown["backward"]["logits"] / (4 * E) - 1) < 0.01


@pytest.mark.parametrize("options", [
    dict(),
    dict(lora_rank=16),
    dict(strategy="ddp", gpus=2, checkpointing="full"),
    dict(strategy="zero2"),
    dict(strategy="zero3"),
], ids=["single", "lora-adapters-off", "ddp", "zero2", "zero3"])
def test_dpo_scaled_run_through_the_real_engines_agrees_with_the_estimate(options, scaled_agrees):
    """Truth on this CPU: the twin trained for real with TRL's DPO loss (torch; DeepSpeed 0.19.8 itself, its reference
    a second engine as prepare_deepspeed makes it), policy and reference from the same weights (the loss starts at log
    2 and falls). Every phase of the estimate of the same twin within 10% of the measured one (measured: single, LoRA,
    DDP and ZeRO-2 within 1%; ZeRO-3 up to 6.6% over: its gathered parameters, as for SFT). The reference's bytes are
    the engine's: what the DPO run holds at set-up beyond the same SFT run's is the estimate's reference item (but for
    the copy's rotary buffers, a few KiB)."""
    s = TrainSetup(run="dpo", batch=1, seq=256, **{"precision": "bf16-mixed", **options})
    r, e = scaled_agrees("qwen2.5-0.5b", s, rel=0.10)
    assert abs(r.meta["losses"][0] - math.log(2)) < 0.01
    sft = scaled.run("qwen2.5-0.5b", s.replace(run="sft"), steps=1, progress=False)
    held = r.gpu.breakdown["setup"]["parameters"] - sft.gpu.breakdown["setup"]["parameters"]
    assert abs(held - _ref(e) - _ref(e, "host")) <= 4 * 2**10      # (the copy's rotary buffers, 2 KiB: not counted)
    assert (held > 2**20) == (s.ref == "copy")


@pytest.mark.parametrize("options", [
    {"strategy": "zero2"}, {"strategy": "zero3"}, {"strategy": "zero3", "offload_params": True, "offload_optimizer": True},
])
def test_deepspeeds_real_engine_keeps_the_reference_as_the_estimate_places_it(options):
    """TRL's prepare_deepspeed on a twin: stage 0 under ZeRO-1/2 (the whole copy cast to bf16), stage 3 partitioned
    (its partitions on the host with offload_param); bytes read from the engine's own parameters."""
    got = measured_reference.placed("qwen2.5-0.5b", TrainSetup(run="dpo", **options))
    assert got["stage"] == (3 if options["strategy"] == "zero3" else 0) and got["dtypes"] == ["torch.bfloat16"]
    assert {d: got[d] for d in ("gpu", "host")} == got["estimate"] and got["gpu"] + got["host"] == 2 * got["params"]


@pytest.mark.parametrize("changes, words", [
    ({"reference": "none"}, "reference 'none' is a DPO, KTO and GRPO option"),
    ({"run": "dpo", "reference": "adapters-off"}, "needs lora_rank"),
    ({"run": "dpo", "reference": "ref"}, "unknown reference 'ref': allowed are copy, adapters-off, none"),
    ({"run": "ppo"}, "unknown run 'ppo': allowed are sft, dpo, kto, rm, grpo"),
    ({"run": "dpo", "strategy": "fsdp2", "gpus": 4, "tensor_parallel": 2}, "run 'dpo' with tensor_parallel"),
    ({"run": "dpo", "batch": 4096, "seq": 4096}, "2 x batch x seq"),
])
def test_bad_dpo_options_are_one_line(changes, words):
    with pytest.raises(InputError, match=words.replace("(", r"\(").replace(")", r"\)")) as exc:
        TrainSetup(**changes).validate()
    assert "\n" not in str(exc.value)


TRL_DPO = """model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct
per_device_train_batch_size: 2
beta: 0.1
max_length: 1024
bf16: true
{extra}"""


@pytest.mark.parametrize("extra, reference", [("", None), ("precompute_ref_log_probs: true", "none"),
                                               ("precompute_ref_log_probs: false", None)])
def test_a_trl_dpo_config_is_read_as_dpo(tmp_path, extra, reference):
    f = tmp_path / "dpo.yaml"
    f.write_text(TRL_DPO.format(extra=extra))
    imported = readers.read([str(f)])
    assert imported.setup.run == "dpo" and imported.setup.reference == reference
    assert not [n for n in imported.not_modelled if n.key in ("beta", "precompute_ref_log_probs")]
    r = estimate.run(imported.model, imported.setup)
    assert "DPO: each forward runs 2 chosen and 2 rejected sequences" in report.table(r)


def test_the_report_says_what_the_reference_is():
    r = estimate.run("qwen2.5-0.5b", TrainSetup(run="dpo", strategy="zero2", gpus=8))
    line = report.reference_lines(r)[1]
    assert "DeepSpeed's stage 0, whole on every GPU" in line and "a log_softmax per sequence over the bf16" in line
    assert report.reference_lines(estimate.run("qwen2.5-0.5b", TrainSetup())) == []


LF_DPO = """model_name_or_path: Qwen/Qwen2.5-0.5B
stage: dpo
finetuning_type: {ft}
per_device_train_batch_size: 1
cutoff_len: 1024
bf16: true
{extra}"""


@pytest.mark.parametrize("ft, extra, reference", [
    ("full", "", "copy"), ("lora", "", "adapters-off"), ("full", "pref_loss: simpo", "none"),
    ("lora", "pref_loss: orpo", "none"), ("lora", "ref_model: Qwen/Qwen2.5-0.5B", "copy"),
])
def test_a_llamafactory_dpo_file_sets_the_reference_as_create_ref_model_does(tmp_path, ft, extra, reference):
    f = tmp_path / "lf.yaml"
    f.write_text(LF_DPO.format(ft=ft, extra=extra))
    imported = readers.read([str(f)])
    s = imported.setup
    assert (s.run, s.ref, s.dpo_logps) == ("dpo", reference, "log-softmax")
    lower = [n for n in imported.not_modelled if "checkpoint's dtype" in n.why]
    assert bool(lower) == (reference == "copy")         # one GPU: the copy is counted as loaded, fp32 (higher)


def test_a_misspelt_pref_loss_is_one_line_and_no_reference_is_said_plainly(tmp_path):
    f = tmp_path / "lf.yaml"
    f.write_text(LF_DPO.format(ft="full", extra="pref_loss: simop"))
    with pytest.raises(readers.ConfigError, match="pref_loss must be one of sigmoid, hinge, ipo, kto_pair, orpo, "
                                                  "simpo .*got 'simop'"):
        readers.read([str(f)])
    line = report.reference_lines(estimate.run("qwen2.5-0.5b", TrainSetup(run="dpo", reference="none")))[1]
    assert "none in the step" in line and "scored beside" not in line


def test_trls_old_torch_dtype_key_is_listed_as_dropped_not_ignored(tmp_path):
    f = tmp_path / "dpo.yaml"
    f.write_text(TRL_DPO.format(extra="torch_dtype: bfloat16"))
    imported = readers.read([str(f)])
    assert "dropped" in {n.key: n.why for n in imported.not_modelled}["torch_dtype"]
    assert "torch_dtype" not in {i.key for i in imported.ignored}
