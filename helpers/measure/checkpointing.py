"""Selective activation checkpointing as torchtitan applies it: an op-level policy through torch's
`torch.utils.checkpoint.create_selective_checkpoint_contexts`, one checkpoint per decoder layer.

The rule (torchtitan `torchtitan/models/llama3/infra/parallelize.py` `_op_sac_save_list` and
`torchtitan/distributed/activation_checkpoint.py` `_apply_op_sac`, `selective_ac_option = "op"`, the default of its
Llama 3 presets): inside each layer's forward the outputs of the attention kernels (flash, memory-efficient, cuDNN),
of reduce-scatters and of `max` are saved, and of the matrix multiplications (`aten.mm`) every odd-numbered one
(1st, 3rd, ...) is saved and every even-numbered one recomputed; all other ops are recomputed in backward. The count
starts afresh for each layer's checkpoint (torchtitan makes a new counter per `context_fn` call).

On a CPU the scaled runs' SDPA runs the CPU flash kernel (`_scaled_dot_product_flash_attention_for_cpu`), which
torchtitan's list (written for CUDA) does not name: here it stands for the CUDA flash kernel and is saved too.
"""

from __future__ import annotations

import collections

import torch


def save_ops() -> set:
    """The ops whose outputs the policy saves (mm only every other one)."""
    aten = torch.ops.aten
    names = ["_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu", "max"]
    ops = {getattr(aten, n).default for n in names if hasattr(aten, n)}
    functional = getattr(torch.ops, "_c10d_functional", None)
    if functional is not None and hasattr(functional, "reduce_scatter_tensor"):
        ops.add(functional.reduce_scatter_tensor.default)
    return ops


def selective_context():
    """A `context_fn` for `torch.utils.checkpoint.checkpoint`: a fresh policy (and mm counter) per layer call."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    saved, mm = save_ops(), torch.ops.aten.mm.default
    count = collections.Counter()

    def policy(ctx, func, *args, **kwargs):
        key = "recompute" if ctx.is_recompute else "forward"
        if func == mm:
            count[key] += 1
            keep = count[key] % 2 == 1
        else:
            keep = func in saved
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def enable(net, mode: str, every: int = 1, reentrant: bool = False) -> None:
    """Checkpoint the decoder layers of a Hugging Face model: 'full' (recompute all) or 'selective' (the policy).
    With `every` N > 1 ('full' only) just every Nth layer, as torchtitan's layer-level option wraps them: the Nth,
    2Nth, ... counted from 1; transformers' GradientCheckpointingLayer reads each layer's own flag. `reentrant`: as
    transformers before 5.0 checkpointed by default (use_reentrant=True; helpers.versions)."""
    if mode == "full":
        net.activation_checkpointing_enable({"use_reentrant": True} if reentrant else None)
        if every > 1:
            for i, layer in enumerate(net.get_decoder().layers):
                layer.gradient_checkpointing = (i + 1) % every == 0
    elif mode == "selective":
        net.activation_checkpointing_enable({"use_reentrant": False, "context_fn": selective_context})
