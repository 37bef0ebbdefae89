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
from helpers.estimate.items import BWD_DONE, BWD_POST, FWD_BWD, MOMENTS, Item
from helpers.estimate.states import Builder, dtype_bytes, lora_adapters
from helpers.models import ModelSpec

ACCUMULATING = FWD_BWD | BWD_POST | BWD_DONE          # the forward and backward moments of every iteration


def add_accumulation(b: Builder, m: ModelSpec) -> None:
    """With grad_accum > 1: gradients made in backward stay alive through the later micro batches' forward and
    backward; add the buffers only accumulation makes."""
    s = b.setup
    if s.grad_accum <= 1:
        return
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
