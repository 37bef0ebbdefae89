"""OpenRLHF's actor step (train_ppo_ray: PPO, GRPO, REINFORCE++, RLOO, Dr. GRPO alike), re-enacted for the dry run.

Re-enacted here, not imported: OpenRLHF and flash-attn are not dependencies, and flash-attn's kernel is Triton (no
CPU). What is kept and when is what memory depends on, read at github:OpenRLHF/OpenRLHF 3c3be623 (2026-08-13):

- `openrlhf/models/actor.py` Actor.forward: the model's logits (the module's dtype: bf16 under DeepSpeed) are
  replaced in the output by an fp32 copy (`output["logits"].to(torch.float32)`, PR 634), the whole sequence's (the
  prompt's too: no logits_to_keep); with `return_entropy` (`--actor.entropy_coef` given, 0 included) the entropy over
  them (`compute_entropy`: softmax, logsumexp, product) with autograd, set on the output; then
  `log_probs_from_logits(logits, torch.roll(sequences, -1, 1))`, sliced to the completion (`action_mask`).
- `openrlhf/models/utils.py` log_probs_from_logits on fp32 logits: flash-attn's Triton `cross_entropy_loss` where
  flash_attn imports (OpenRLHF's default attention, flash_attention_2, needs it), else the labels' logits gathered
  less `_logsumexp_by_chunk` (1024 rows at a time, written into a zeroed fp32 vector).
- flash-attn (github:Dao-AILab/flash-attention 058ad35, flash_attn/ops/triton/cross_entropy.py CrossEntropyLoss):
  forward allocates the losses, lse and z_losses (one fp32 per row each) and saves the logits, lse and labels;
  backward allocates `dlogits = torch.empty_like(logits)` (inplace_backward False, as OpenRLHF calls it).
- `openrlhf/trainer/ray/ppo_actor.py` training_step: `action_log_probs, output = self.actor(...)`; the clipped policy
  loss (`PolicyLoss`, ppo), the KL loss against the reference's log-probs (`--algo.kl.use_loss`); `output` (its fp32
  logits, and the entropy's graph) stays referenced through `strategy.backward` and `strategy.optimizer_step`, until
  training_step returns.
"""

from __future__ import annotations

import torch

LOGSUMEXP_CHUNK = 1024       # openrlhf/models/utils.py _logsumexp_by_chunk(chunk_size=1024)
TRITON_ROWS = 64             # rows per logsumexp in the Triton kernel's stand-in: its temporary, 64 x vocab fp32 (38
                             # MiB at Qwen2.5's vocabulary), is the stand-in's own (the kernel has none)
EPSILON = 0.2                # --actor.eps_clip's default (train_ppo_ray.py)
SOURCE = "OpenRLHF 3c3be623 models/actor.py Actor.forward, models/utils.py log_probs_from_logits"
FLASH_CE = "flash-attn 058ad35 flash_attn/ops/triton/cross_entropy.py CrossEntropyLoss"


class TritonCrossEntropy(torch.autograd.Function):
    """flash-attn's Triton cross-entropy as memory sees it: three fp32 vectors of one value per row in forward, the
    logits, lse and labels saved, and one fp32 gradient the size of the logits in backward."""

    @staticmethod
    def forward(ctx, logits, labels):
        lse = torch.empty(logits.shape[0], device=logits.device, dtype=logits.dtype)   # (the kernel's torch.empty)
        for start in range(0, logits.shape[0], TRITON_ROWS):   # the kernel reads the logits in place; torch's
            lse[start:start + TRITON_ROWS] = torch.logsumexp(logits[start:start + TRITON_ROWS], dim=-1)   # logsumexp
        # makes a temporary of its input's size: a block of rows at a time keeps it to TRITON_ROWS x vocab
        losses = lse - logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        torch.empty_like(lse)                                  # z_losses (for logging; freed unless returned)
        ctx.save_for_backward(logits, lse, labels)
        return losses

    @staticmethod
    def backward(ctx, grad):
        logits, lse, labels = ctx.saved_tensors
        dlogits = torch.empty_like(logits)                     # cross_entropy_bwd_kernel writes the gradient here:
        dlogits.copy_(logits).sub_(lse.unsqueeze(-1)).exp_()   # softmax - one-hot, times the loss's gradient, in
        dlogits.scatter_add_(-1, labels.unsqueeze(-1), -torch.ones_like(lse).unsqueeze(-1))   # place
        return dlogits.mul_(grad.unsqueeze(-1)), None


def log_probs_from_logits(logits, labels, triton: bool):
    """OpenRLHF's log_probs_from_logits on fp32 logits (temperature 1.0: no division): flash-attn's Triton
    cross-entropy where it is installed (`triton`), else gather less a chunked logsumexp."""
    batch_dim, last = logits.shape[:-1], logits.shape[-1]
    if triton:
        return -TritonCrossEntropy.apply(logits.reshape(-1, last), labels.reshape(-1)).view(*batch_dim)
    picked = torch.gather(logits, dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)
    flat = logits.reshape(-1, last)
    lse = torch.zeros(flat.shape[0], device=logits.device, dtype=logits.dtype)
    for start in range(0, flat.shape[0], LOGSUMEXP_CHUNK):
        end = min(start + LOGSUMEXP_CHUNK, flat.shape[0])
        lse[start:end] = torch.logsumexp(flat[start:end], dim=-1)
    return picked - lse.view(*batch_dim)


def compute_entropy(logits):
    """openrlhf/models/utils.py compute_entropy, with autograd (the Actor calls it outside no_grad)."""
    pd = torch.nn.functional.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)


def actor_loss(ids, completion: int, *, forward, triton: bool, entropy: bool, kl: bool, old=None,
               set_context=lambda name: None):
    """One micro batch of OpenRLHF's actor step: (loss, held, action log-probs detached), `held` what training_step
    keeps referenced until it returns (the output's fp32 logits and, with the entropy, its graph). `forward(ids)`
    returns the model's logits (the caller's precision context around the forward); `old`: the log-probs the samples
    were scored with (make_experience's), or None for these (the ratio starts at 1)."""
    logits = forward(ids)
    set_context("logits")
    logits = logits.to(torch.float32)
    ent = compute_entropy(logits)[:, :-1] if entropy else None
    logps = log_probs_from_logits(logits, torch.roll(ids, shifts=-1, dims=1), triton)[:, :-1]
    mask = torch.ones(ids.shape[0], completion, device=ids.device)
    action = logps[:, -completion:] * mask
    old, advantages = (action.detach() if old is None else old), torch.ones_like(mask)
    ratio = (action - old).exp()
    surr = torch.min(ratio * advantages, ratio.clamp(1 - EPSILON, 1 + EPSILON) * advantages)
    loss = (-surr * mask).sum() / mask.sum()
    if kl:                                                     # compute_approx_kl against the reference's log-probs
        base = torch.zeros_like(action)
        loss = loss + 1e-3 * ((action.float() - base) ** 2 / 2 * mask).sum() / mask.sum()
    if ent is not None:                                        # entropy_coef 0: logged, not in the loss's graph
        ent[:, -completion:].mean()
    set_context(None)
    return loss, (logits, ent), action.detach()


class ActorStep:
    """The actor's loss over a run's micro batches: the samples' old log-probs are the first forward's (one fixed
    batch trained several times, as PPO's epochs over one experience: the clipped ratio rises, the loss falls), and
    what training_step holds is dropped when the next micro batch begins."""

    def __init__(self, setup, set_context=lambda name: None):
        self.setup, self.set_context, self.old, self.held = setup, set_context, None, None

    def __call__(self, forward, ids):
        s = self.setup
        self.held = None                                       # the previous training_step has returned
        loss, self.held, action = actor_loss(ids, s.completion_tokens, forward=forward, triton=s.attention == "flash",
                                             entropy=s.entropy_kept, kl=s.ref != "none", old=self.old,
                                             set_context=self.set_context)
        if self.old is None:
            self.old = action
        return loss
