"""Library versions in a set-up (helpers.versions) and the rules keyed by them: bitsandbytes before 0.43.2 kept every
4-bit linear's input for backward (commit 9e75374); transformers before 4.49 copied the fp32 logits to shift them,
and before 4.46 upcast them in the model's forward. The estimate places each; the dry and scaled runs re-enact the old
release on the installed one, so against them the estimate is consistency, not truth (the published LitGPT QLoRA
runs, made with bitsandbytes 0.42.0, are an independent check: tests/test_published_runs.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from packaging.version import Version

import helpers
from helpers import estimate, evidence, models, report, versions
from helpers.__main__ import main
from helpers.errors import InputError
from helpers.estimate import activations
from helpers.measure import causal_lm_loss, dryrun, nf4, scaled
from helpers.training import TrainSetup

OLD = "bitsandbytes=0.42.0"


def _matmul_ctx(keep_old: bool):
    """A Linear4bit run on this CPU by the installed bitsandbytes, its input needing a gradient: (input, the
    autograd node's ctx.tensors)."""
    lin = torch.nn.Sequential(torch.nn.Linear(128, 64, bias=False, dtype=torch.bfloat16))
    lin.get_output_embeddings = lambda: None
    nf4.quantize(lin, double=False)
    x = torch.randn(4, 128, dtype=torch.bfloat16, requires_grad=True)
    if keep_old:
        with nf4.inputs_kept():
            out = lin(x)
    else:
        out = lin(x)
    node = out.grad_fn
    while not hasattr(node, "tensors"):           # (Linear4bit casts back to the input dtype: a view or a copy)
        node = node.next_functions[0][0]
    return x, node.tensors


def test_installed_matmul_keeps_no_input_and_the_reenactment_keeps_exactly_it():
    x, (a, b) = _matmul_ctx(keep_old=False)
    assert a is None and b is not None                       # 0.43.2 and later: (None, B)
    x, (a, b) = _matmul_ctx(keep_old=True)
    assert a is x and b is not None                          # before 0.43.2: (A, B), the input itself
    assert versions.installed("bitsandbytes") >= versions.Version("0.43.2")


@pytest.mark.parametrize("text,needle", [
    ("bitsandbytes", "is not library=version"),
    ("torchao=0.1", "no rule here depends on the release of torchao"),
    ("bitsandbytes=0.42,bnb=0.43", "bitsandbytes is given twice"),
    ("bitsandbytes=zero", "'zero' is not a release number"),
    ("", "library=version pairs"),
])
def test_bad_versions_are_one_line_errors(text, needle):
    with pytest.raises(InputError) as err:
        TrainSetup(versions=text).validate()
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_the_release_comes_from_the_setup_or_the_installed_library():
    s = TrainSetup(lora_rank=8, base_weights="nf4", versions="bnb==0.43.1")
    assert versions.of(s, "bitsandbytes") == (versions.Version("0.43.1"), "given") and versions.older(
        s, "bnb_4bit_input_kept")
    here = TrainSetup(lora_rank=8, base_weights="nf4")
    assert versions.of(here, "bitsandbytes")[1] == "installed" and not versions.older(here, "bnb_4bit_input_kept")
    assert not versions.older(s.replace(versions="bitsandbytes=0.43.2"), "bnb_4bit_input_kept")
    rules = {r["key"]: r for r in versions.applied(s)}
    rule = rules["bnb_4bit_input_kept"]
    assert rule["older"] and rule["version"] == "0.43.1" and "9e75374" in rule["source"]
    assert not rules["causal_lm_loss_copies_logits"]["older"] and rules["causal_lm_loss_copies_logits"]["from"] == "installed"
    no_base = {r["key"] for r in versions.applied(TrainSetup(lora_rank=8, versions=OLD))}
    assert "bnb_4bit_input_kept" not in no_base                    # no 4-bit base: the rule does not bear
    assert versions.applied(TrainSetup(fused_ce=True, precision="fp32", adam_impl="fused")) == []   # no HF loss, 4-bit base, foreach


SETUPS = [
    dict(precision="bf16", lora_rank=16, lora_targets="q,v", lora_dropout=0.05, seq=512, batch=2, attention="flash"),
    dict(precision="bf16-mixed", lora_rank=16, base_weights="nf4-dq", seq=512, batch=2, attention="sdpa"),
    dict(precision="bf16", lora_rank=16, lora_targets="q,v", seq=512, batch=2, attention="flash",
         checkpointing="full"),
    dict(precision="bf16", lora_rank=16, lora_targets="q,k,v,o", seq=512, batch=2, attention="sdpa",
         checkpointing="full", checkpoint_every=2),
]


@pytest.mark.parametrize("kw", SETUPS, ids=["dropout", "mixed-sdpa", "ckpt", "ckpt-every-2"])
def test_dry_run_with_the_old_matmul_agrees_with_the_estimate(kw):
    """Llama-3.2-1B on fake tensors through the installed bitsandbytes with its old matmul re-enacted: every phase
    within 0.5% of the estimate, and what the old release adds (old minus new) within 2% of what the estimate adds."""
    s = TrainSetup(**{"base_weights": "nf4", **kw})
    old = s.replace(versions=OLD)
    d_new, d_old = dryrun.run("llama-3.2-1b", s, progress=False), dryrun.run("llama-3.2-1b", old, progress=False)
    e_new, e_old = estimate.run("llama-3.2-1b", s), estimate.run("llama-3.2-1b", old)
    assert evidence.kind(d_old) == "re-enacted" and evidence.kind(d_new) == "measured"
    for phase, measured in d_old.gpu.phases.items():
        assert e_old.gpu.phases[phase] == pytest.approx(measured, rel=0.005), phase
    for phase in ("forward", "backward", "steady"):
        added = d_old.gpu.phases[phase] - d_new.gpu.phases[phase]
        assert added > 300 * 2**20
        assert e_old.gpu.phases[phase] - e_new.gpu.phases[phase] == pytest.approx(added, rel=0.02), phase


def test_adapters_that_share_the_input_leave_nothing_extra():
    """peft's adapters in the base's dtype without dropout save the very input the old matmul kept: all-linear in
    bf16 adds nothing without checkpointing (measured 0 bytes on a dry run), and everything under checkpointing."""
    m = "llama-3.2-1b"
    s = TrainSetup(precision="bf16", lora_rank=16, base_weights="nf4", seq=512, batch=2, versions=OLD,
                   adapter_dtype="bf16")
    from helpers import models
    spec = models.spec(m)
    assert activations.kept_4bit_inputs(spec, s) == (0, 0)
    per, first = activations.kept_4bit_inputs(spec, s.replace(checkpointing="full"))
    assert (per, first) == (2 * (2 * spec.hidden + spec.q_width + spec.intermediate), 0)
    d = dryrun.run(m, s, progress=False)
    assert d.gpu.phases == dryrun.run(m, s.replace(versions=None), progress=False).gpu.phases


def test_scaled_run_through_bitsandbytes_with_the_old_matmul_agrees_with_the_estimate():
    """The twin quantised by bitsandbytes and trained for real on this CPU with the old matmul re-enacted: every
    phase within 3% of the estimate (as the current matmul's scaled runs are, tests/test_qlora.py)."""
    setup = TrainSetup(precision="bf16", lora_rank=8, lora_targets="q,v", lora_dropout=0.05, base_weights="nf4",
                       batch=2, seq=128, versions=OLD)
    r = scaled.run("llama-3-8b", setup, steps=2, progress=False)
    twin, s = scaled.scaled_setup("llama-3-8b", setup)
    e, new = estimate.run(str(twin), s), estimate.run(str(twin), s.replace(versions=None))
    assert r.meta["losses"][-1] < r.meta["losses"][0] and evidence.kind(r) == "re-enacted"
    assert e.gpu.peak_bytes > new.gpu.peak_bytes
    for phase, measured in r.gpu.phases.items():
        assert e.gpu.phases[phase] == pytest.approx(measured, rel=0.03), phase


@pytest.mark.parametrize("model,kw,needle", [
    ("llama-3.2-1b", dict(attention="eager"), "attention 'eager' is not"),
])
def test_what_the_old_matmul_is_not_modelled_for_is_refused(model, kw, needle):
    s = TrainSetup(lora_rank=8, base_weights="nf4", versions=OLD, **kw)
    with pytest.raises(InputError) as err:
        estimate.run(model, s)
    assert needle in str(err.value) and "0.43.2 or later" in str(err.value)


def test_report_and_cli_list_the_rule(capsys):
    r = estimate.run("llama-3.2-1b", TrainSetup(lora_rank=8, base_weights="nf4", lora_dropout=0.05, versions=OLD))
    text = report.table(r)
    assert "bitsandbytes 0.42.0 (given) < 0.43.2: MatMul4Bit keeps each 4-bit linear's input" in text
    assert any("before 0.43.2" in i["name"] for i in r.items)
    assert main(["estimate", "--model", "llama-3.2-1b", "--lora-rank", "8", "--fused-ce", "--adam-impl", "fused",
                 "--versions", OLD]) == 0
    assert "no rule that changed across these releases bears on this set-up" in capsys.readouterr().out
    assert main(["estimate", "--model", "llama-3.2-1b", "--versions", "cuda=12"]) == 2
    assert "error: versions: no rule here depends on the release of cuda" in capsys.readouterr().err


TF_SETUPS = [dict(precision="bf16", batch=2, seq=1024, attention="flash", adam_impl="fused"),
             dict(precision="bf16-mixed", batch=1, seq=2048, adam_impl="fused"),
             dict(precision="bf16", lora_rank=16, batch=2, seq=1024, checkpointing="full")]


@pytest.mark.parametrize("kw", TF_SETUPS, ids=["bf16-b2", "mixed-b1", "lora-ckpt-b2"])
@pytest.mark.parametrize("release", ["4.48.0", "4.45.0"])
def test_dry_run_with_an_old_transformers_loss_agrees_with_the_estimate(kw, release):
    """Llama-3.2-1B on fake tensors with the loss of transformers 4.48 (the shifted logits copied) or 4.45 (and the
    logits upcast by the forward, the bf16 ones freed): every phase within 0.5% of the estimate, and the change
    against the installed release within 1% (or 16 MiB, what the dry-run benchmark counts as none) of the estimate's.
    With batch 1 the shift is a view: no copy."""
    s = TrainSetup(**kw)
    old = s.replace(versions=f"transformers={release}")
    d_new, d_old = dryrun.run("llama-3.2-1b", s, progress=False), dryrun.run("llama-3.2-1b", old, progress=False)
    e_new, e_old = estimate.run("llama-3.2-1b", s), estimate.run("llama-3.2-1b", old)
    for phase, measured in d_old.gpu.phases.items():
        assert e_old.gpu.phases[phase] == pytest.approx(measured, rel=0.005), phase
        added = measured - d_new.gpu.phases[phase]
        assert e_old.gpu.phases[phase] - e_new.gpu.phases[phase] == pytest.approx(added, rel=0.01, abs=16 * 2**20), phase
    forward = d_old.gpu.phases["forward"] - d_new.gpu.phases["forward"]
    E = s.batch * s.seq * 128256
    expected = {("4.48.0", 2): 4 * E, ("4.45.0", 2): 2 * E, ("4.48.0", 1): 0, ("4.45.0", 1): -2 * E}[release, s.batch]
    assert forward == pytest.approx(expected, rel=0.01, abs=2**20)


def test_the_old_loss_is_the_same_loss():
    """The re-enacted loss computes what the installed one does (it only shifts the logits where 4.49 shifts the
    labels): same value, same gradient of the logits."""
    torch.manual_seed(0)
    logits = torch.randn(2, 16, 50, requires_grad=True)
    labels = torch.randint(0, 50, (2, 16))
    from transformers.loss.loss_utils import ForCausalLMLoss

    new = ForCausalLMLoss(logits, labels, vocab_size=50)
    g_new, = torch.autograd.grad(new, logits)
    old = causal_lm_loss._shifted_logits_loss(logits, labels, vocab_size=50)
    g_old, = torch.autograd.grad(old, logits)
    assert torch.allclose(new, old) and torch.allclose(g_new, g_old)


def test_scaled_run_with_an_old_transformers_loss_agrees_with_the_estimate():
    """The twin trained for real on this CPU with transformers 4.45's loss re-enacted: every phase within 3% of the
    estimate, and its loss phase larger than with the installed release's."""
    setup = TrainSetup(precision="bf16", adam_impl="fused", batch=4, seq=256, versions="transformers=4.45.0")
    r = scaled.run("llama-3-8b", setup, steps=2, progress=False)
    twin, s = scaled.scaled_setup("llama-3-8b", setup)
    e = estimate.run(str(twin), s)
    assert r.meta["losses"][-1] < r.meta["losses"][0] and evidence.kind(r) == "re-enacted"
    for phase, measured in r.gpu.phases.items():
        assert e.gpu.phases[phase] == pytest.approx(measured, rel=0.03), phase
    assert e.gpu.breakdown["forward"]["logits"] > estimate.run(str(twin), s.replace(versions=None)).gpu.breakdown[
        "forward"]["logits"]


@pytest.mark.parametrize("kw", [dict(), dict(checkpoint_every=2)], ids=["every-layer", "every-2nd"])
def test_reentrant_checkpointing_of_older_transformers_keeps_no_4bit_inputs(kw, dry_agrees):
    """Before transformers 5.0 gradient checkpointing was reentrant (use_reentrant=True): the checkpointed forward
    runs without autograd, so bitsandbytes 0.42's MatMul4Bit keeps nothing there; only layers not checkpointed keep
    their inputs. The dry run (torch's own reentrant checkpoint) and the estimate agree within 0.5%, and with every
    layer checkpointed the old bitsandbytes adds nothing."""
    s = TrainSetup(precision="bf16", lora_rank=16, base_weights="nf4", seq=1024, batch=2, checkpointing="full", **kw)
    both = s.replace(versions="transformers=4.57.0," + OLD)
    _, e = dry_agrees("llama-3.2-1b", both, rel=0.005)
    reentrant = estimate.run("llama-3.2-1b", s.replace(versions="transformers=4.57.0"))
    if not kw:
        assert e.gpu.phases == reentrant.gpu.phases
    else:
        assert e.gpu.peak_bytes > reentrant.gpu.peak_bytes
    assert {r["key"]: r["older"] for r in e.meta["versioned"]}["checkpointing_reentrant"]


def test_fixes_offer_the_upgrade():
    """A set-up pinned to bitsandbytes 0.42: `fixes` tries the installed release as a way out, and it saves what the
    old matmul kept."""
    from helpers import fixes

    s = TrainSetup(precision="bf16", lora_rank=16, lora_dropout=0.05, base_weights="nf4", seq=1024, batch=2,
                   versions=OLD, gpu_gib=8)
    ways = {w.name: w for w in fixes.ways_out("llama-3.2-1b", s)}
    up = next(w for name, w in ways.items() if name.startswith("bitsandbytes ") and name.endswith("(upgrade)"))
    assert up.change == {"versions": None}
    assert up.result.gpu.peak_bytes < estimate.run("llama-3.2-1b", s).gpu.peak_bytes


# -- torch AdamW's step temporaries by release -------------------------------------------------------------------

ADAMW_RUNS = json.loads((models.DATA_DIR / "results" / "torch_foreach_adamw_versions.json").read_text())["runs"]


def _adamw_temporary(setup: TrainSetup, model: str = "llama-2-7b") -> int:
    return sum(i["bytes"] for i in estimate.run(model, setup).items if i["name"].startswith("AdamW ")
               and "temporar" in i["name"])


def test_old_torch_wheels_measured_two_foreach_lists_and_the_rule_says_so():
    """The real wheels of torch 2.0.1, 2.1.0, 2.1.2 and 2.2.0 (measured here by helpers/measure/foreach_adamw.py,
    recorded in data/results/torch_foreach_adamw_versions.json): the foreach step held two lists the size of the
    parameters before 2.1.0 and one from it, in fp32 and bf16 alike; the for-loop step three tensors of one parameter's
    size (3/4 of four equal ones). The rule's release is the measured boundary."""
    rule = next(r for r in versions.RULES if r.key == "foreach_adamw_two_lists")
    seen = {r["torch"].split("+")[0] for r in ADAMW_RUNS}
    assert {"2.0.1", "2.1.0", "2.1.2", "2.2.0"} <= seen
    for r in ADAMW_RUNS:
        assert r["reset_works"] and r["step_ran"], r
        old = Version(r["torch"].split("+")[0]) < Version(rule.changed_in)
        want = (2.0 if old else 1.0) if r["foreach"] else 3 / r["count"]
        assert abs(r["temporaries"] - want) < 0.01, r


@pytest.mark.parametrize("flag,count,want", [([], 2, 1.0), (["--for-loop"], 2, 1.5), (["--for-loop"], 1, 2.0)])
def test_the_installed_torch_measured_live(flag, count, want):
    """The same measurement with the installed torch, in a process of its own: foreach holds one list; for-loop two
    tensors of a parameter's size, three once a previous parameter's denominator is still bound."""
    out = subprocess.run([sys.executable, str(Path(helpers.__file__).parent / "measure" / "foreach_adamw.py"),
                          "--count", str(count), "--numel", str(8 * 2**20)] + flag,
                         capture_output=True, text=True, check=True, timeout=120).stdout
    r = json.loads(out)
    assert r["reset_works"] and abs(r["temporaries"] - want) < 0.02, r


def test_the_estimate_adds_one_list_under_torch_2_0():
    """torch 2.0.1 in the set-up: the foreach temporary is two lists of what one step updates (the whole model for
    one GPU, the flat partition for the Trainer's AdamW under ZeRO-2); for-loop and fused are unchanged."""
    params = models.spec("llama-2-7b").params
    one = TrainSetup(precision="bf16", seq=512)
    assert _adamw_temporary(one.replace(versions="torch=2.0.1")) == 2 * _adamw_temporary(one) == 2 * 2 * params
    z2 = TrainSetup(strategy="zero2", gpus=8, seq=512, adam_impl="foreach")
    assert _adamw_temporary(z2.replace(versions="torch=2.0.1")) - _adamw_temporary(z2) == 4 * params // 8
    for impl in ("for-loop", "fused"):
        s = TrainSetup(seq=512, adam_impl=impl)
        assert _adamw_temporary(s.replace(versions="torch=2.0.1")) == _adamw_temporary(s)


def test_for_loop_holds_the_previous_denominator():
    """Llama 2 70B: its MLP weights (28,672 x 8,192) come three in a row, so the for-loop step's peak is three of them
    (the previous one's denominator, this one's sqrt and quotient), more than twice the embedding (32,000 x 8,192)."""
    m = models.spec("llama-2-70b")
    assert m.for_loop_adam_params == 3 * 28672 * 8192 > 2 * 32000 * 8192
    assert _adamw_temporary(TrainSetup(seq=512, adam_impl="for-loop"), "llama-2-70b") == 4 * 3 * 28672 * 8192
