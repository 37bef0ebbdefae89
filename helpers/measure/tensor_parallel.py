"""torchtitan's tensor-parallel plan, applied with torch's `torch.distributed.tensor.parallel` to a Hugging Face
Llama-style model, for dry runs on a fake process group.

The plan is torchtitan's `apply_tp` (pytorch/torchtitan `torchtitan/models/llama3/infra/parallelize.py` at commit
238fa9953e4a; later moved to `models/llama3/sharding.py`), with Hugging Face's module names: embed_tokens
RowwiseParallel (Replicate in, Shard(1) out); every RMSNorm SequenceParallel; self_attn and mlp PrepareModuleInput
(Shard(1) -> Replicate: the sequence all-gathered); q/k/v and gate/up ColwiseParallel; o and down RowwiseParallel
with a Shard(1) output; lm_head ColwiseParallel from a Shard(1) input to Shard(-1) logits kept as a DTensor for
`loss_parallel`. Hugging Face computes rotary positions from the hidden states' length, which a Shard(1) embedding
output cuts to 1/tp: the step passes `position_ids` of the whole sequence (torchtitan precomputes freqs_cis alike).
"""

from __future__ import annotations

import contextlib

import torch


def apply(model, tp_mesh) -> None:
    """Parallelise `model` (a Hugging Face causal LM with Llama's module names) over the 1-D mesh `tp_mesh`."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    inner = model.base_model
    parallelize_module(model, tp_mesh, {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "model.norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    })
    gathered = dict(input_kwarg_layouts={"hidden_states": Shard(1)},
                    desired_input_kwarg_layouts={"hidden_states": Replicate()})
    for layer in inner.layers:
        parallelize_module(layer, tp_mesh, {
            "input_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(**gathered),
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            "post_attention_layernorm": SequenceParallel(),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
        })


def loss(model, ids, tracker=None):
    """The next-token loss under loss parallelism: Shard(-1) logits, upcast to fp32 as transformers'
    ForCausalLMLoss does, cross-entropy over the sharded vocabulary (call `.backward()` inside `loss_parallel()`).
    Computed after the model's forward, as torchtitan's train step does; `tracker` counts it as logits."""
    from torch.distributed.tensor.parallel import loss_parallel

    positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
    logits = model(input_ids=ids, position_ids=positions).logits
    if tracker is not None:
        tracker.set_context("logits")
    with loss_parallel():
        result = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids.flatten())
    if tracker is not None:
        tracker.set_context(None)
    return result


@contextlib.contextmanager
def real_mesh_arithmetic():
    """FSDP2 on a TP-sharded parameter joins the data-parallel and TP meshes (`DeviceMesh._concatenate`, torch 2.13),
    whose rank arithmetic runs on small integer tensors; inside a FakeTensorMode those become fake and `nonzero`
    cannot run on them. Run that arithmetic on real tensors (it touches no model data)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    original = DeviceMesh._concatenate

    def concatenate(meshes):
        with unset_fake_temporarily():
            return original(meshes)

    DeviceMesh._concatenate = staticmethod(concatenate)
    try:
        yield
    finally:
        DeviceMesh._concatenate = staticmethod(original)
