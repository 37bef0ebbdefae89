"""TRL's SFT losses, re-enacted on the installed transformers for the dry runs of a set-up whose `trl_loss` names one
(TRL is not a dependency; these follow its released source, allocation for allocation):

- 'chunked' (TRL 1.4.0 to 1.14.x, `loss_type="chunked_nll"`, the default from 1.7.0): `_patch_chunked_ce_lm_head`
  runs the backbone, takes the hidden states shifted by one (`hidden_states[..., :-1, :].reshape(-1, H)`), packs the
  valid tokens to the front (`hidden[order]`, a copy) and computes the loss 256 tokens at a time, each chunk under
  non-reentrant `torch.utils.checkpoint`: `_chunk` makes the chunk's logits, `log_softmax`, `nll_loss`, `argmax` and
  the entropy `-(log_p.exp() * log_p)`. Up to 1.12.x `_chunk` projects in fp32, `h.float() @ w.float().t()` (the
  output head's weight upcast for every chunk, in forward and in the recompute); from 1.13.0
  `(h @ w.to(h.dtype).t()).float()` (trl/trainer/sft_trainer.py, releases 1.12.0 and 1.13.0).
- 'tiled' (TRL 1.15.0 on, every loss_type: `add_fused_lm_head` and `trl.kernels.ChunkedLogProbFunction`): the valid
  positions' hidden states (`hidden_states[mask]`, a copy) go through the head in tiles of 4096 tokens x 32768 vocabulary
  columns written into one `mm_buf`; a Triton kernel folds each tile into per-token statistics in registers (it
  allocates nothing); forward saves the hidden states, the weight and log_z; backward re-projects every tile into a
  second `mm_buf`, turns it into the logits' gradient in place and accumulates fp32 gradients of the hidden states and
  (when it is trained) of the head's weight (`torch.addmm(..., out_dtype=torch.float32, out=acc)` on CUDA with torch
  >= 2.8: no temporaries), then casts them to the inputs' dtypes (trl/kernels/chunked_logprob.py and
  trl/trainer/utils.py, release 1.16.0).

Every token is a valid label here (a language-modelling dataset; with a prompt-completion dataset TRL drops the
prompt's positions before the head, so these buffers are smaller there).
"""

from __future__ import annotations

import math

import torch

from helpers.estimate.sft_loss import CHUNK_TOKENS, TILE_STATS, TILE_TOKENS, TILE_VOCAB


def _chunk(h, w, labels, upcast: bool):
    """One chunk's loss (trl `_chunk`): its logits, log_softmax, nll, argmax and entropy."""
    logits = h.float() @ w.float().t() if upcast else (h @ w.to(h.dtype).t()).float()
    log_p = torch.nn.functional.log_softmax(logits, dim=-1)
    loss = torch.nn.functional.nll_loss(log_p, labels, ignore_index=-100, reduction="sum")
    correct = (logits.argmax(dim=-1) == labels).sum().float()
    entropy = (-(log_p.exp() * log_p).sum(dim=-1)).sum()
    return loss, correct, entropy


def chunked(hidden_states, weight, labels, upcast: bool):
    """TRL 1.4-1.14's `_chunked_cross_entropy_loss` for labels all valid (the mean over the tokens)."""
    hidden = hidden_states[..., :-1, :].reshape(-1, hidden_states.size(-1))
    labels = labels[..., 1:].reshape(-1)
    order = (labels != -100).to(torch.int8).argsort(descending=True, stable=True)
    hidden, labels = hidden[order], labels[order]
    n = labels.numel()
    loss = hidden.new_zeros((), dtype=torch.float32)
    correct, entropy = loss.clone(), loss.clone()
    for start in range(0, math.ceil(n / CHUNK_TOKENS) * CHUNK_TOKENS, CHUNK_TOKENS):
        c_loss, c_correct, c_entropy = torch.utils.checkpoint.checkpoint(
            _chunk, hidden[start:start + CHUNK_TOKENS], weight, labels[start:start + CHUNK_TOKENS], upcast,
            use_reentrant=False)
        loss, correct, entropy = loss + c_loss, correct + c_correct, entropy + c_entropy
    return loss / n


class _TiledLogProbs(torch.autograd.Function):
    """trl.kernels.ChunkedLogProbFunction as it runs on a CUDA GPU with Triton, for its allocations: the per-token
    statistics, one tile buffer, the casts of each hidden-state and weight slice to the compute dtype; the tile's
    values (folded by Triton in registers, accumulated by cuBLAS into fp32 outputs) are not computed here."""

    @staticmethod
    def forward(ctx, hidden, weight, targets):
        n, vocab = hidden.shape[0], weight.shape[0]
        dev = hidden.device
        compute = torch.get_autocast_dtype(dev.type) if torch.is_autocast_enabled(dev.type) else hidden.dtype
        stats = [torch.zeros((n,), device=dev, dtype=torch.float32) for _ in range(TILE_STATS)]
        mm_buf = torch.empty((min(n, TILE_TOKENS), TILE_VOCAB), device=dev, dtype=compute)
        for t0 in range(0, n, TILE_TOKENS):
            t1 = min(t0 + TILE_TOKENS, n)
            h = hidden[t0:t1].to(compute)
            for v0 in range(0, vocab, TILE_VOCAB):
                v1 = min(v0 + TILE_VOCAB, vocab)
                torch.mm(h, weight[v0:v1].to(compute).t(), out=mm_buf[:t1 - t0, :v1 - v0])
        log_z = stats[0] + torch.log(stats[1])
        logprobs = stats[6] - log_z
        ctx.save_for_backward(hidden, weight, log_z)
        ctx.compute = compute
        return logprobs

    @staticmethod
    def backward(ctx, grad_logprobs):
        hidden, weight, log_z = ctx.saved_tensors
        n, vocab = hidden.shape[0], weight.shape[0]
        need_h, need_w = ctx.needs_input_grad[:2]
        grad_h = torch.zeros(hidden.shape, device=hidden.device, dtype=torch.float32) if need_h else None
        grad_w = torch.zeros(weight.shape, device=weight.device, dtype=torch.float32) if need_w else None
        mm_buf = torch.empty((min(n, TILE_TOKENS), TILE_VOCAB), device=hidden.device, dtype=ctx.compute)
        grad_logprobs = grad_logprobs.float().contiguous()
        for t0 in range(0, n, TILE_TOKENS):
            t1 = min(t0 + TILE_TOKENS, n)
            h = hidden[t0:t1].to(ctx.compute)
            for v0 in range(0, vocab, TILE_VOCAB):
                v1 = min(v0 + TILE_VOCAB, vocab)
                w = weight[v0:v1].to(ctx.compute)
                torch.mm(h, w.t(), out=mm_buf[:t1 - t0, :v1 - v0])
        return (grad_h.to(hidden.dtype) if need_h else None, grad_w.to(weight.dtype) if need_w else None, None)


def tiled(hidden_states, weight, labels):
    """TRL 1.15+'s fused LM head (`_fused_forward`) for labels all valid: the mean negative log-likelihood."""
    hidden = hidden_states[:, :-1]
    labels = labels[:, 1:]
    mask = labels != -100
    # hidden_states[mask]: one copy of the valid rows (every row here: indexed by position, so that the fake tensors
    # know the shape without reading the mask)
    b, s = mask.shape
    pos = torch.arange(b * s, device=hidden.device)
    rows = hidden[pos // s, pos % s]
    logprobs = _TiledLogProbs.apply(rows, weight, labels.reshape(-1))
    per_token = logprobs.new_zeros(mask.shape).masked_scatter(mask, logprobs)
    return -per_token.sum() / mask.numel()


def loss(model, ids, how: str, upcast: bool = False, tracker=None):
    """The SFT loss of `model` on `ids` the way `how` ('chunked', 'tiled') computes it: the backbone's hidden states,
    then the output head's weight read directly (its module is not called). The tracker's context is 'logits' from
    the hidden states on, in forward and in backward until their gradient is made."""
    hidden = model.get_decoder()(input_ids=ids).last_hidden_state
    weight = model.get_output_embeddings().weight
    if tracker is not None:
        tracker.set_context("logits")
        hidden.register_hook(lambda grad: tracker.set_context(None))
    try:
        return chunked(hidden, weight, ids, upcast) if how == "chunked" else tiled(hidden, weight, ids)
    finally:
        if tracker is not None:
            tracker.set_context(None)
