"""OpenRLHF's actor step (`run` 'grpo', `dpo_logps` 'openrlhf': train_ppo_ray's PPO, GRPO, REINFORCE++, RLOO, Dr.
GRPO alike): its logits and log-probabilities, in place of TRL's.

Read at github:OpenRLHF/OpenRLHF 3c3be623 (2026-08-13) and flash-attn 058ad35, re-enacted for the dry run by
`helpers.measure.rl_loss` (whose docstring cites the lines):

- **Every position's logits.** Actor.forward asks the model for the whole sequence's logits (prompt and completion:
  no logits_to_keep), in the module's 16-bit dtype under DeepSpeed, and replaces them in the output by an fp32 copy:
  both alive while the copy is made.
- **Held until the step is done.** training_step keeps `output` (the fp32 logits) referenced through
  `strategy.backward` and `strategy.optimizer_step`: the fp32 logits are alive through backward and, for the micro
  batch that ends the accumulation, through the optimizer step. With `--actor.entropy_coef` given (`entropy_kept`),
  `compute_entropy` runs with autograd and its softmax (fp32, the logits' size) is kept by the graph the output holds;
  while it is computed, its product with the logits is alive too.
- **The log-probabilities.** With flash-attn installed (`attention` 'flash': OpenRLHF's default flash_attention_2
  needs the package) its Triton cross-entropy saves the logits and a per-row lse and, in backward, allocates one fp32
  gradient the size of the logits, which the copy's backward casts to 16-bit while it is alive. Without flash-attn
  the labels' logits are gathered less a logsumexp taken 1024 rows at a time: in backward the chunks' gradients are
  accumulated into one the size of the logits, and meeting the gather's dense gradient it is added out of place
  (it reaches the logits as a view): three fp32 logits-sized gradients at once.
Measured by a dry run of the step re-enacted (`helpers.measure.dryrun.OpenRLHFActorStep`, ZeRO-1/2 alike).
"""

from __future__ import annotations

from helpers.estimate.activations import add_softcap
from helpers.estimate.items import BWD_DONE, BWD_END, BWD_HEAD, BWD_POST, BWD_START, LOSS, STEP, STEP_NORM, STEP_PREPARE
from helpers.estimate.states import Builder
from helpers.models import ModelSpec
from helpers.units import fmt

SOURCE = ("OpenRLHF 3c3be623 models/actor.py Actor.forward, models/utils.py log_probs_from_logits, "
          "trainer/ray/ppo_actor.py training_step")
FLASH_CE = "flash-attn 058ad35 flash_attn/ops/triton/cross_entropy.py CrossEntropyLoss"
MEASURED = "measured by a dry run of the step re-enacted"
# training_step's `output` is referenced until it returns: its forward's loss, the whole backward, the step
HELD = LOSS | BWD_START | BWD_HEAD | BWD_END | BWD_POST | BWD_DONE | STEP_NORM | STEP_PREPARE | STEP


def triton_ce(setup) -> bool:
    """Whether log_probs_from_logits takes flash-attn's Triton cross-entropy: flash-attn is installed wherever the
    run's attention is flash_attention_2 (OpenRLHF's default); otherwise counted without it (the larger way)."""
    return setup.attention == "flash"


def add_logits(b: Builder, m: ModelSpec) -> None:
    s = b.setup
    T = s.batch * s.seq
    E = T * m.vocab
    c = 4 if s.precision == "fp32" else 2
    b.gpu("fp32 logits of every position (held by training_step's output until it returns)", "logits", 4 * E, HELD,
          f"{s.batch} sequences x {s.seq} positions x {m.vocab:,} = {E:,} elements x 4 B = {fmt(4 * E)}: the "
          f"output's logits replaced by their fp32 copy, referenced through backward and the optimizer step "
          f"({SOURCE}; {MEASURED})")
    if s.entropy_kept:
        b.gpu("the entropy's softmax (kept by the graph the output holds)", "logits", 4 * E, HELD,
              f"compute_entropy with autograd (--actor.entropy_coef given): softmax of the fp32 logits, "
              f"{fmt(4 * E)}, saved by its graph, which the output keeps ({SOURCE}; {MEASURED})")
        b.gpu("the entropy's product of its softmax and the logits (computed, then summed)", "logits", 4 * E, LOSS,
              f"`pd * logits` in compute_entropy, {fmt(4 * E)}, beside the softmax and the logits: more than the "
              f"16-bit logits beside their copy, which come before it ({SOURCE})")
    elif c == 2:
        b.gpu("the model's 16-bit logits, until their fp32 copy is made", "logits", c * E, LOSS,
              f"{fmt(c * E)} alive with the copy (`output['logits'].to(torch.float32)`), then dropped ({SOURCE})")
    rows = 4 * T
    if triton_ce(s):
        b.gpu("flash-attn cross-entropy's per-row losses, lse and z_losses", "logits", 3 * rows, LOSS,
              f"three fp32 vectors of {T:,} rows ({FLASH_CE}); the lse saved for backward")
        b.gpu("the cross-entropy's gradient (fp32) and its 16-bit cast", "logits", 4 * E + c * E, BWD_START,
              f"dlogits = torch.empty_like(logits), {fmt(4 * E)}, then the copy's backward casts it to "
              f"{s.half} ({fmt(c * E)}) while it is alive ({FLASH_CE}; {MEASURED})")
    else:
        b.gpu("the labels' logits and the chunked logsumexp (fp32 vectors)", "logits", 2 * rows, LOSS,
              f"torch.gather's output and _logsumexp_by_chunk's zeroed vector, {T:,} rows each ({SOURCE})")
        b.gpu("the log-probabilities' gradients: the logsumexp's, the gather's and their sum (fp32)", "logits",
              12 * E, BWD_START,
              f"three fp32 gradients the size of the logits at once, {fmt(12 * E)}: the chunks' logsumexp "
              f"gradients accumulated into one (a view through the reshape, so not added to in place), the "
              f"gather's dense gradient, and their sum; the copy's later cast to {s.half} holds less ({SOURCE}; "
              f"{MEASURED})")
    add_softcap(b, m, c * E)
