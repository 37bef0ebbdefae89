"""KTO (`run` 'kto', TRL 1.10's KTOTrainer; axolotl's `rl: kto` trains with it): unpaired sequences, the reference
model placed as DPO's, and the KL term's mismatched batch through the policy and the reference under no_grad. The
estimate against a dry run of TRL's step re-enacted (helpers.measure.preference_loss.kto_loss) at full size, against
the twin trained for real with the same loss through torch and DeepSpeed, and the readers that set it."""

import math
from pathlib import Path

import pytest

from helpers import estimate, readers, report
from helpers.errors import InputError
from helpers.measure import dryrun
from helpers.training import TrainSetup

UPSTREAM = Path(__file__).resolve().parent / "data" / "configs_upstream"


@pytest.mark.parametrize("options", [
    dict(batch=4, seq=1024),
    dict(batch=4, seq=1024, lora_rank=16, checkpointing="full"),
    dict(batch=4, seq=1024, strategy="zero2", gpus=8),
    dict(batch=2, seq=1024, reference="none", precision="fp32"),
], ids=["copy", "lora-adapters-off", "zero2", "precomputed-fp32"])
def test_kto_estimate_agrees_with_a_dry_run_of_trls_step_per_phase(options):
    """Every phase within 0.5% of the dry run and none under by 2 MiB (measured: within 0.2%): the KL batch's two
    no_grad forwards, which the estimate gives no moment of their own, are never a phase's peak."""
    s = TrainSetup(run="kto", **options)
    d = dryrun.run("qwen2.5-0.5b", s, progress=False)
    e = estimate.run("qwen2.5-0.5b", s, lifecycle=False)
    for phase, measured in d.gpu.phases.items():
        assert abs(e.gpu.phases[phase] / measured - 1) < 0.005 and e.gpu.phases[phase] > measured - 2 * 2**20, \
            (phase, e.gpu.phases[phase], measured)


def test_a_kto_batch_is_unpaired():
    """KTO's batch of 2 is two sequences: DPO's batch of 1 (one chosen, one rejected) in every phase."""
    kto = estimate.run("llama-3.2-1b", TrainSetup(run="kto", batch=2, seq=1024), lifecycle=False)
    dpo = estimate.run("llama-3.2-1b", TrainSetup(run="dpo", batch=1, seq=1024), lifecycle=False)
    assert kto.gpu.phases == dpo.gpu.phases
    line = report.reference_lines(kto)[1]
    assert line.startswith("KTO: each forward runs 2 unpaired sequences") and "a frozen copy" in line


@pytest.mark.parametrize("options", [dict(), dict(strategy="zero2")], ids=["single", "zero2"])
def test_kto_scaled_run_through_the_real_engines_agrees_with_the_estimate(options, scaled_agrees):
    """The twin trained for real with TRL's KTO loss (torch; DeepSpeed 0.19.8 with its reference engine in stage 0),
    policy and reference from the same weights: the loss starts at 1 - sigmoid(0) = 0.5 and falls; every phase
    within 10% (measured: within 0.2%)."""
    s = TrainSetup(run="kto", batch=2, seq=256, precision="bf16-mixed", **options)
    r, _ = scaled_agrees("qwen2.5-0.5b", s, rel=0.10)
    assert math.isclose(r.meta["losses"][0], 0.5, abs_tol=0.01)


TRL_KTO = """model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct
per_device_train_batch_size: 4
beta: 0.1
{extra}
max_length: 1024
bf16: true
"""


@pytest.mark.parametrize("extra, reference", [
    ("desirable_weight: 1.0\nundesirable_weight: 1.33", None),
    ("loss_type: apo_zero_unpaired", None),
    ("desirable_weight: 1.0\nprecompute_ref_log_probs: true", "none"),
])
def test_a_trl_kto_config_is_read_as_kto(tmp_path, extra, reference):
    f = tmp_path / "kto.yaml"
    f.write_text(TRL_KTO.format(extra=extra))
    imported = readers.read([str(f)])
    assert (imported.setup.run, imported.setup.reference, imported.setup.batch) == ("kto", reference, 4)
    assert not [n for n in imported.not_modelled if n.key in ("beta", "desirable_weight", "loss_type")]
    assert "KTO: each forward runs 4 unpaired sequences" in report.table(estimate.run(imported.model, imported.setup))


def test_axolotls_own_kto_example_is_read_as_kto():
    """axolotl's examples/llama-3/qlora-1b-kto.yaml (copied unchanged, tests/data/configs_upstream/SOURCES.md): rl kto
    over a 4-bit base with LoRA: TRL's KTOTrainer with the adapters disabled as its reference."""
    imported = readers.read([str(UPSTREAM / "axolotl" / "examples" / "llama-3" / "qlora-1b-kto.yaml")])
    s = imported.setup
    assert (imported.model, s.run, s.ref, s.batch, s.seq, s.lora_rank, s.quantized) == \
        ("llama-3.2-1b", "kto", "adapters-off", 2, 2048, 32, True)
    assert not [n for n in imported.not_modelled if n.key == "rl"]


def test_kto_options_are_one_line():
    with pytest.raises(InputError, match="reference 'copy' is a DPO, KTO and GRPO option") as e:
        TrainSetup(reference="copy").validate()
    assert "\n" not in str(e.value)
    with pytest.raises(InputError, match="run 'kto' with tensor_parallel"):
        TrainSetup(run="kto", strategy="fsdp2", gpus=2, tensor_parallel=2).validate()


def test_a_misspelt_kto_key_is_refused_not_ignored(tmp_path):
    """TRL's parser refuses a key KTOConfig does not have: `desireable_weight` was listed as ignored (helper-63)."""
    from helpers.readers.base import ConfigError

    f = tmp_path / "kto.yaml"
    f.write_text(TRL_KTO.format(extra="desireable_weight: 1.0\nundesirable_weight: 1.3"))
    with pytest.raises(ConfigError, match="unknown key 'desireable_weight': did you mean 'desirable_weight'"):
        readers.read([str(f)])


def test_precomputed_kto_says_no_reference_forward():
    r = estimate.run("llama-3.2-1b", TrainSetup(run="kto", batch=2, seq=512, reference="none"), lifecycle=False)
    line = report.reference_lines(r)[1]
    assert "through the policy under no_grad" in line and "and the reference" not in line


def test_llamafactorys_own_kto_trainer_is_listed_whether_or_not_run_kto_is_given(tmp_path):
    """LLaMA-Factory's KTO trainer differs from TRL's (helpers.readers.llamafactory): listed as not modelled, and the
    note is true of both readings, SFT and --run kto (it said "estimated as SFT" beside a KTO estimate)."""
    f = tmp_path / "lf.yaml"
    f.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct\nstage: kto\nfinetuning_type: lora\n"
                 "per_device_train_batch_size: 2\ncutoff_len: 1024\nbf16: true\n")
    (note,) = [n for n in readers.read([str(f)]).not_modelled if n.key == "stage"]
    assert "or with --run kto as TRL's KTOTrainer" in note.why and note.why.endswith("the real figure is higher")
