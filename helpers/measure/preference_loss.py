"""DPO's and KTO's losses as TRL 1.10's DPOTrainer and KTOTrainer compute them (huggingface/trl at f2cd577,
trl/trainer/dpo_trainer.py and kto_trainer.py `_compute_loss`, trl/trainer/utils.py `selective_log_softmax`),
re-enacted for the dry runs (fake tensors) and the scaled runs (the twin through the real engines) alike: one place,
so that both measure the same step.

Re-enacted here, not imported: TRL is not a dependency. What is kept and when is what memory depends on: the
policy's logits (returned in fp32 by accelerate's native-amp wrapper where it wraps one, in the module's dtype under
DeepSpeed), its per-sequence log-probabilities with their saved tensors, the reference's forward under no_grad after
the policy's, scored and dropped, and the sigmoid loss.
"""

from __future__ import annotations

import torch

BETA = 0.1      # DPOConfig.beta's and KTOConfig.beta's default (TRL 1.10)


def sequence_logps(logits, labels, how: str = "logsumexp"):
    """Each sequence's summed log-probability of `labels` under `logits` (batch x seq x vocab). 'logsumexp': as
    TRL 1.10's `selective_log_softmax` takes it (`sequence_token_logps`); 'log-softmax': as LLaMA-Factory's
    `get_batch_logps`, the labels gathered from the whole `log_softmax` (src/llamafactory/train/trainer_utils.py)."""
    if how == "log-softmax":
        return torch.gather(logits.log_softmax(-1), 2, labels.unsqueeze(2)).squeeze(2).sum(-1)
    return sequence_token_logps(logits, labels).sum(-1)


def sequence_token_logps(logits, labels):
    """Per-token log-probabilities of `labels` as TRL 1.10's `selective_log_softmax` takes them (trl/trainer/utils.py):
    from fp32 logits the labels' logits gathered, less a logsumexp taken one sequence at a time; from 16-bit ones a
    log_softmax per sequence, gathered."""
    if logits.dtype not in (torch.float32, torch.float64):
        return torch.stack([torch.nn.functional.log_softmax(row, dim=-1).gather(-1, lab.unsqueeze(-1)).squeeze(-1)
                            for row, lab in zip(logits, labels)])
    picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
    norm = torch.stack([torch.logsumexp(row, dim=-1) for row in logits])
    return picked - norm


def _no_context(name):
    return None


def fp32_outputs(setup) -> bool:
    """Whether the loss takes the logits in fp32: accelerate's native-amp wrapper returns them so wherever it wraps the
    forward (not under DeepSpeed, where TRL takes the module's bf16 logits); LLaMA-Factory casts them itself."""
    return not setup.strat.deepspeed or setup.dpo_logps == "log-softmax"


def loss(policy, reference, ids, setup, set_context=_no_context, fp32_outputs: bool = True):
    """The preference loss of the set-up's run ('dpo': `dpo_loss`, 'kto': `kto_loss`), same arguments."""
    how = kto_loss if setup.run == "kto" else dpo_loss
    return how(policy, reference, ids, setup, set_context, fp32_outputs)


def _forward_logps(forward, ids, setup, set_context, fp32_outputs):
    """`forward(ids)` scored as TRL scores it, its output dropped as soon as its logits are taken: (the logits, each
    sequence's log-probability); a caller that drops the logits at once (a no_grad forward) frees them there."""
    out = forward(ids)
    set_context("logits")
    logits = out.logits.float() if fp32_outputs else out.logits
    del out
    logps = sequence_logps(logits[:, :-1], ids[:, 1:], setup.dpo_logps)
    set_context(None)
    return logits, logps


def _scored(forward, ids, setup, set_context, fp32_outputs):
    """A no_grad forward's log-probabilities (`_forward_logps`), its logits freed."""
    return _forward_logps(forward, ids, setup, set_context, fp32_outputs)[1]


def dpo_loss(policy, reference, ids, setup, set_context=_no_context, fp32_outputs: bool = True):
    """The sigmoid DPO loss of one micro batch `ids` (each pair's chosen sequences, then its rejected ones).

    `policy(ids)` and `reference(ids)` run the forwards and return the model outputs (`reference` is called under
    no_grad; None where the set-up's reference is 'none': precomputed log-probabilities, read from the dataset).
    `fp32_outputs`: the outputs' logits are taken in fp32 (accelerate's `convert_outputs_to_fp32` around an autocast
    forward; a no-op on fp32 logits); False under DeepSpeed, where accelerate wraps no native-amp forward and TRL
    takes the 16-bit logits row by row. `set_context('logits')` / `set_context(None)`: a tracker's naming of what the
    loss makes."""
    # (the logits stay referenced until the loss is computed: TRL's `outputs`, LLaMA-Factory's returned logits)
    logits, logps = _forward_logps(policy, ids, setup, set_context, fp32_outputs)
    if reference is None:
        ref = torch.zeros_like(logps)       # precomputed: read from the dataset, not computed here
    else:
        with torch.no_grad():
            ref = _scored(reference, ids, setup, set_context, fp32_outputs)
    set_context("logits")
    chosen, rejected = (logps - ref).chunk(2)
    loss = -torch.nn.functional.logsigmoid(BETA * (chosen - rejected)).mean()
    del logits
    set_context(None)
    return loss


def kto_loss(policy, reference, ids, setup, set_context=_no_context, fp32_outputs: bool = True):
    """The KTO loss of one micro batch `ids` of unpaired examples (the first of every two desirable), as TRL 1.10's
    KTOTrainer `_compute_loss` takes it: first the KL term's batch (each example's prompt with another example's
    completion, `KL_input_ids`: here the batch rolled by one) through the policy under no_grad
    (`_compute_kl_logps`), then the policy's forward with its log-probabilities (its `outputs` referenced until the
    loss), then the reference's KL forward and its forward on the batch, both under no_grad, and the loss
    (loss_type 'kto': 1 - sigmoid(beta x (log-ratio - KL)) for desirable, 1 - sigmoid(beta x (KL - log-ratio)) for
    undesirable). Arguments as `dpo_loss`'s."""
    kl_ids = ids.roll(1, dims=0)
    with torch.no_grad():
        kl_logps = _scored(policy, kl_ids, setup, set_context, fp32_outputs)
    logits, logps = _forward_logps(policy, ids, setup, set_context, fp32_outputs)
    if reference is None:
        ref, ref_kl = torch.zeros_like(logps), torch.zeros_like(kl_logps)      # precomputed: read from the dataset
    else:
        with torch.no_grad():
            ref_kl = _scored(reference, kl_ids, setup, set_context, fp32_outputs)
            ref = _scored(reference, ids, setup, set_context, fp32_outputs)
    set_context("logits")
    kl = (kl_logps - ref_kl).mean().clamp(min=0).detach()
    ratio = logps - ref
    desirable = torch.arange(ids.shape[0], device=ids.device) % 2 == 0
    losses = torch.where(desirable, 1 - torch.sigmoid(BETA * (ratio - kl)), 1 - torch.sigmoid(BETA * (kl - ratio)))
    result = losses.mean()
    del logits
    set_context(None)
    return result
