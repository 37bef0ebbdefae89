"""What kind of evidence a Result is, in words a figure can carry.

Four kinds, from strongest to weakest:
- measured: the bytes of the engine's own tensors, counted as it made them (a real run, or a dry run of the real
  engine on fake tensors), each on the device the engine put it;
- placed by rule: the engine's own tensors, measured, but which of them count as "GPU" and which as "host" is decided
  by a rule we wrote (a CPU has one RAM; DeepSpeed's own sub-group map says 'cpu' for every group there);
- re-enacted: an engine that cannot run here (DeepSpeed on fake tensors, DDP's bucket) rebuilt in torch with the
  engine's buffer sizes, from our reading of its source; or a library release other than the installed one whose
  change is put back on the installed release (bitsandbytes before 0.43.2: `helpers.measure.nf4.inputs_kept`;
  transformers before 4.49: `helpers.measure.causal_lm_loss`);
- estimated: arithmetic over named buffers (`helpers.estimate`).

A check of an estimate against a re-enacted or rule-placed figure is a consistency check (the same rules on both
sides), not a test against reality; `kind(result)` says which it is so that every plot and table can say so.
"""

from __future__ import annotations

from helpers import versions
from helpers.results import Result

KINDS = {
    "measured": "measured from the engine's own tensors",
    "placed": "measured tensors, GPU/host placed by rule",
    "re-enacted": "re-enacted in torch",
    "estimated": "estimated",
}


def kind(result: Result) -> str:
    """One of KINDS for `result` (its mode, strategy and offload settings decide)."""
    s, mode = result.train_setup, result.mode
    if mode == "estimate":
        return "estimated"
    if mode in ("dry-run", "scaled") and (_old_matmul(s) or _old_loss(s) or s.kv_expanded):
        return "re-enacted"
    if mode == "dry-run":
        return s.strat.dry_run_evidence
    if mode == "scaled":
        return "placed" if s.offload_optimizer or s.offload_params else "measured"
    return "measured"                                        # gpu: the engine's tensors on a real GPU


def detail(result: Result) -> str:
    """A sentence: the kind, and what exactly was rebuilt or placed by rule."""
    k, s = kind(result), result.train_setup
    text = {
        "estimated": "estimated: arithmetic over named buffers",
        "measured": "measured from the engine's own tensors",
        "placed": "the engine's own tensors measured; their GPU/host role placed by our rule (one RAM on a CPU)",
        "re-enacted": "re-enacted in torch from our reading of the engine's source",
    }[k]
    if result.mode == "dry-run":
        text += " (full size, fake tensors)"
        st = s.strat
        if st.gradient_buckets:
            text += "; DDP itself not run: its gradient bucket is one buffer sized by rule"
        elif st.deepspeed:
            text += "; DeepSpeed cannot run on fake tensors"
    elif result.mode == "scaled":
        text += " (the tiny twin, trained for real on this CPU)"
    if result.mode in ("dry-run", "scaled") and _old_matmul(s):
        text += (f"; bitsandbytes {versions.of(s, 'bitsandbytes')[0]}'s 4-bit matmul re-enacted on the installed "
                 f"{versions.installed('bitsandbytes')} (its input kept, as before 0.43.2)")
    if result.mode in ("dry-run", "scaled") and _old_loss(s):
        text += (f"; transformers {versions.of(s, 'transformers')[0]}'s causal-LM loss re-enacted on the installed "
                 f"{versions.installed('transformers')} (the logits shifted by a copy"
                 + (", upcast by the forward)" if versions.older(s, "logits_upcast_in_forward") else ")"))
    if result.mode in ("dry-run", "scaled") and s.kv_expanded:
        text += ("; torchtune's / LitGPT's attention re-enacted on transformers' model (keys and values expanded to "
                 "every query head before the kernel)")
    tp, cp = s.tensor_parallel, s.context_parallel
    if tp > 1 and result.mode == "dry-run":
        text += f"; tensor parallel {tp}: torchtitan's plan run by DTensor on a fake 2-D mesh"
    elif tp > 1:
        text += f"; tensor parallel {tp}: torchtitan's plan (dry run: DTensor on a fake 2-D mesh)"
    if cp > 1:
        text += (f"; context parallel {cp}: estimated only, not measured (no dry run: torch's context_parallel "
                 f"patches F.scaled_dot_product_attention, which the fake GPU's attention does not call)")
    return text


def _old_matmul(s) -> bool:
    return s.quantized and versions.older(s, "bnb_4bit_input_kept")


def _old_loss(s) -> bool:
    return not s.fused_ce and versions.older(s, "causal_lm_loss_copies_logits")


def label(result: Result) -> str:
    """Short label for a legend: 'dry run — re-enacted in torch'."""
    if result.mode == "estimate":
        return "estimate (arithmetic)"
    mode = {"dry-run": "dry run", "scaled": "scaled run", "gpu": "GPU run"}.get(result.mode, result.mode)
    return f"{mode} — {KINDS[kind(result)]}"


def of_all(results) -> str:
    """The evidence of several results as one phrase: their label when they share one, else each label once, in order."""
    labels = list(dict.fromkeys(label(r) for r in results))
    return labels[0] if len(labels) == 1 else "; ".join(labels)
