"""Tensor parallelism (TP) and context parallelism (CP): what one rank holds of the model and of a layer's
activations when `tensor_parallel` or `context_parallel` is above 1.

TP follows torchtitan's plan for Llama (pytorch/torchtitan `torchtitan/models/llama3/infra/parallelize.py`,
`apply_tp`, at commit 238fa9953e4a, the last before the config-system refactor #2386 moved it to
`models/llama3/sharding.py`): the embedding RowwiseParallel (its weight split over the vocabulary), q/k/v and
gate/up ColwiseParallel (output features split), o and down RowwiseParallel with a Shard(1) output (input features
split, the result reduce-scattered over the sequence), every RMSNorm SequenceParallel (weight replicated, input and
output split over the sequence), PrepareModuleInput all-gathering the sequence before attention and the MLP, and
the output head ColwiseParallel with Shard(-1) logits under loss_parallel (each rank keeps 1/tp of the vocabulary).
With FSDP2 the TP shard of every parameter is sharded again over the data-parallel and context-parallel ranks
(torchtitan's `dp_shard_cp` mesh); with DDP it is replicated over the data-parallel ranks.

What one rank keeps, per layer, under TP degree t and CP degree c, for T = batch x seq / c tokens:
- the q/k/v, attention and MLP tensors at 1/t of their width (heads and intermediate features split);
- the norms' fp32 upcast and normalised output at 1/t (sequence-parallel), the residual stream at 1/t;
- the all-gathered (full-sequence) input of the colwise linears, once before attention and once before the MLP:
  the linears save it, at full width (torch's DTensor keeps the gathered tensor; Megatron's re-gather in backward
  is not what torch does);
- the logits at 1/t of the vocabulary (loss parallel).
CP (torch `torch/distributed/tensor/experimental/_context_parallel/_attention.py`, torch 2.13: the default rotate
method ALL_GATHER): every activation at 1/c of the sequence; ring attention gathers the keys and values of the whole
sequence while one layer's attention runs (forward, and again in its backward), a temporary modelled as such.
Left out: the communication buffers of TP's all-gathers and reduce-scatters beyond the saved ones (transient,
one tensor at a time), the DTensor metadata, and CP's load-balancing reorder buffers of the input ids.
"""

from __future__ import annotations

import dataclasses

from helpers.errors import InputError
from helpers.models import ModelSpec, Tensor

ROWWISE = ("o_proj", "down_proj")
"""Linears split over their input features (torchtitan: wo, w2)."""


def check(m: ModelSpec, setup) -> None:
    """InputError unless `m` can take the TP/CP plan at these degrees (dense Llama-style layers, widths divisible)."""
    tp, cp = setup.tensor_parallel, setup.context_parallel
    if tp == 1 and cp == 1:
        return
    unlike = [what for what, has in (("mixture-of-experts layers", m.moe_layers), ("latent attention (MLA)", m.kv_latent),
                                     ("a fused qkv/gate_up linear", m.fused_qkv or m.fused_gate_up),
                                     ("Gemma's norms", m.gemma_norm or m.norms != 2),
                                     ("soft-capped logits", m.logit_softcap),
                                     ("an output head tied to the embedding", m.tied and tp > 1)) if has]
    if unlike:
        raise InputError(f"tensor/context parallelism is modelled for dense Llama-style decoders (torchtitan's plan); "
                         f"{m.name} has {unlike[0]}: use tensor_parallel=1 and context_parallel=1")
    for what, n in (("attention heads", m.heads), ("key/value heads", m.kv_heads), ("MLP width", m.intermediate),
                    ("vocabulary", m.vocab), ("sequence (sequence parallelism)", setup.seq // cp)):
        if n % tp:
            raise InputError(f"tensor_parallel={tp} must divide {m.name}'s {what} ({n}): pick a divisor of it")


def _split(t: Tensor, tp: int) -> Tensor:
    """One rank's TP shard of tensor `t`: the shape's split dimension divided by tp, norms whole."""
    if tp == 1 or t.ndim < 2:
        return t
    out_f, in_f = t.shape
    module = t.name.rsplit(".", 2)[-2]
    if module in ROWWISE:
        shape = (out_f, in_f // tp)
    else:                                  # colwise linears, the embedding (rowwise over the vocabulary), the head
        shape = (out_f // tp, in_f)
    return dataclasses.replace(t, numel=shape[0] * shape[1], shape=shape)


def rank_model(m: ModelSpec, tp: int) -> ModelSpec:
    """The model as one TP rank holds it: every 2-D weight split as torchtitan's plan splits it, norms replicated,
    the per-rank widths (heads, key/value heads, MLP width, vocabulary) divided by tp."""
    if tp == 1:
        return m
    return dataclasses.replace(
        m, name=f"{m.name} (TP rank of {tp})", tensors=tuple(_split(t, tp) for t in m.tensors),
        heads=m.heads // tp, kv_heads=m.kv_heads // tp, q_width=m.q_width // tp, k_width=m.k_width // tp,
        v_width=m.v_width // tp, intermediate=m.intermediate // tp, vocab=m.vocab // tp)


def rank_setup(setup):
    """The set-up as one CP rank sees its micro batch: 1/cp of each sequence (the rest of the set-up unchanged)."""
    cp = setup.context_parallel
    return setup if cp == 1 else dataclasses.replace(setup, seq=setup.seq // cp)
