"""Hugging Face's causal-LM loss as older transformers releases computed it, re-enacted on the installed one for the
measured runs of a set-up whose `versions` name such a release (helpers.versions):

- before 4.49.0 the loss shifted the logits, not the labels: `ForCausalLMLoss` (4.46-4.48; before that
  `LlamaForCausalLM.forward` itself) upcast them to fp32 and took `logits[..., :-1, :].contiguous()`, a copy, before
  `cross_entropy` (transformers 4.48.0 `loss/loss_utils.py`; 4.49.0 pads the labels instead, PR #35646);
- before 4.46.0 the model's forward upcast its logits itself (`logits = logits.float()`, 4.45.0
  `models/llama/modeling_llama.py`) and returned the fp32 ones, so the bf16 output of the head was freed at once: here
  a forward hook on the output head returns its output upcast.

The installed model and loss run otherwise unchanged; only these steps, read from those releases, are put back.
"""

from __future__ import annotations

import torch


def _shifted_logits_loss(logits, labels, vocab_size: int, num_items_in_batch=None, ignore_index: int = -100,
                         **kwargs):
    """The loss before transformers 4.49: the logits upcast, shifted by a contiguous copy, then cross-entropy."""
    logits = logits.float()
    shift_logits = logits[..., :-1, :].contiguous().view(-1, vocab_size)
    shift_labels = labels[..., 1:].contiguous().view(-1).to(shift_logits.device)
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = torch.nn.functional.cross_entropy(shift_logits, shift_labels, ignore_index=ignore_index, reduction=reduction)
    return loss / num_items_in_batch if reduction == "sum" else loss


def as_released(net, setup) -> None:
    """Give `net` (a transformers causal LM, before peft wraps it) the loss of the set-up's transformers release."""
    from helpers import versions

    if setup.fused_ce:
        return
    if versions.older(setup, "causal_lm_loss_copies_logits"):
        net.loss_function = _shifted_logits_loss
    if setup.precision != "fp32" and versions.older(setup, "logits_upcast_in_forward"):
        net.get_output_embeddings().register_forward_hook(lambda module, args, output: output.float())
