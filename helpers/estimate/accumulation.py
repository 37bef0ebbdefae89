"""Gradient accumulation: N micro batches per optimizer step, and what stays alive between them.

A phase's figure is its worst moment over every micro batch. From the second micro batch on, the gradients the
first one made are still there (summed into in place) while the next forward and backward run, so every gradient
buffer that backward makes and the step frees is alive through all forward and backward moments; the first micro
batch's figures are never larger (the same buffers, fewer of them). Sources, in the installed libraries:
- torch (`torch/csrc/autograd/functions/accumulate_grad.h`): AccumulateGrad adds a new gradient into `param.grad` in
  place, so each new gradient exists beside the accumulated one only until it is added; the embedding's, made last
  and the size of the vocabulary times the hidden size, is the largest such moment after the output head's.
- DeepSpeed 0.19.8 `runtime/zero/stage_1_and_2.py`: ZeRO-1 reduces only at the accumulation boundary, keeping whole
  `param.grad`s until then; ZeRO-2's `grads_in_partition` (contiguous_gradients) is what later micro batches add into;
  with offload_optimizer, `async_accumulate_grad_in_cpu_via_gpu` keeps `accumulated_grads_in_cpu`, one host buffer
  per parameter of the partition in the model dtype (`param.numel()` elements, pinned with pin_memory), made at the
  first micro step and never freed. `runtime/zero/stage3.py` accumulates into buffers it holds anyway
  (`grad_partitions_flat_buffer`; with offload the fp32 gradient buffers of each sub-group): nothing new.
- FSDP2 (`_fsdp_collectives.foreach_reduce`): each micro batch's reduce-scatter output is added into the sharded
  gradient, which stays alive between micro batches.
"""

from __future__ import annotations

from helpers.estimate.adapters import converted
from helpers.estimate.items import BWD_DONE, BWD_END, BWD_POST, FORWARDS, FWD_BWD, MOMENTS, START, Item
from helpers.estimate.states import Builder, dtype_bytes, fsdp1_units, fsdp2_reduce_bytes, lora_adapters
from helpers.models import ModelSpec

ACCUMULATING = FWD_BWD | BWD_POST | BWD_DONE          # the forward and backward moments of every iteration


def add_accumulation(b: Builder, m: ModelSpec) -> None:
    """With grad_accum > 1: gradients made in backward stay alive through the later micro batches' forward and
    backward; add the buffers only accumulation makes."""
    s = b.setup
    if s.grad_accum <= 1:
        return
    if s.strat.family in ("fsdp1", "fsdp2") and not s.sync_each_batch:
        return _no_sync(b, m)
    for i, item in enumerate(b.items):
        if item.category == "gradients" and item.moments & BWD_DONE and not item.moments >= ACCUMULATING:
            b.items[i] = Item(item.name + f" (accumulated over {s.grad_accum} micro batches)", item.category,
                              item.device, item.nbytes, item.moments | ACCUMULATING, item.why, item.blocks)
    compute, storage = dtype_bytes(s)
    keeps_param_grads = "gradients" not in s.strat.shards and not (s.strat.deepspeed and s.offload_optimizer)
    if keeps_param_grads and not m.tied and not s.lora_rank:
        b.gpu("a later micro batch's embedding gradient, before it is added", "gradients",
              m.group_params["embed"] * (compute if s.strat.deepspeed else storage), BWD_DONE,
              "AccumulateGrad: the new gradient exists beside param.grad until it is added in place")
    if s.strat.deepspeed and s.offload_optimizer and "parameters" not in s.strat.shards:
        trained = lora_adapters(m, s.lora_rank, s.lora_targets, converted(m, s)) if s.lora_rank else m
        blocks = [s.degrees.split(t.numel) * compute for t in trained.tensors]
        later = frozenset(MOMENTS[MOMENTS.index("backward_head"):])
        b.host(f"accumulated_grads_in_cpu ({'bf16' if compute == 2 else 'fp32'})", "gradients", sum(blocks), later,
               "stage_1_and_2.py async_accumulate_grad_in_cpu_via_gpu: one buffer per parameter of the partition, "
               "made at the first micro step, never freed" + ("; pinned" if s.pin_memory else ""),
               pinned=s.pin_memory, blocks=blocks)


def _no_sync(b: Builder, m: ModelSpec) -> None:
    """FSDP with every micro batch but the last under no_sync (the HF Trainer, accelerate's accumulate(), LitGPT's
    Fabric): no reduce-scatter until the last micro batch, so each unit keeps its unsharded gradient on every GPU
    from the first micro batch's backward to the last one's post-backward, and the sharded gradients are made in
    the last micro batch only (their items keep their moments). torch 2.13: FSDP2 `_fsdp_param.py`
    to_accumulated_grad_if_needed keeps each unsharded gradient in the reduce dtype (fsdp2_reduce_bytes) and
    accumulate_unsharded_grad_if_needed adds the next into it; FSDP1 `_runtime_utils.py` _post_backward_hook returns
    early without _sync_gradients, leaving the unsharded flat gradient in the compute dtype (padded)."""
    s = b.setup
    compute, _ = dtype_bytes(s)
    trained = lora_adapters(m, s.lora_rank, s.lora_targets, converted(m, s)) if s.lora_rank else m
    G = s.degrees.shard
    if s.strat.family == "fsdp2":
        r = fsdp2_reduce_bytes(s)
        nbytes = trained.params * r
        how = f"in {'bf16' if r == 2 else 'fp32'} (the reduce dtype)"
    else:
        units = [t.numel for t in trained.tensors] if s.lora_rank else fsdp1_units(trained)
        nbytes = sum(-(-n // G) * G for n in units) * compute
        how = f"in {'bf16' if compute == 2 else 'fp32'} (the unsharded flat parameters' dtype), padded"
    # Before the last micro batch nothing is reduce-scattered: its forward and the earlier micro batches' ends hold
    # no sharded gradient and no reduce-scatter buffer, and the end of the first micro batch's backward (every
    # unsharded gradient made, nothing reduced) outweighs the last one's. The start of the last backward keeps both.
    first_only = FORWARDS | START | BWD_END | BWD_POST | BWD_DONE
    for i, item in enumerate(b.items):
        if item.device == "gpu" and item.category in ("gradients", "comm_buffers") and item.moments & first_only:
            b.items[i] = Item(item.name, item.category, item.device, item.nbytes, item.moments - first_only,
                              item.why, item.blocks)
    b.gpu(f"unsharded gradients accumulated under no_sync, {how}", "gradients", nbytes, ACCUMULATING,
          f"{s.grad_accum - 1} of {s.grad_accum} micro batches run under no_sync (sync_each_batch off): every unit's "
          f"whole gradient stays on every GPU until the last micro batch reduce-scatters it")
