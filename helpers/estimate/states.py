"""Model states per GPU and per node: parameters, master weights, gradients, AdamW states, engine buffers.

Sources, read in the installed libraries: DeepSpeed 0.19.8 `runtime/zero/stage_1_and_2.py` (fp32 partition and its
pinned fp32 gradient, `grads_in_partition`, the ipg reduce buckets, the fp32 gradient made at the step) and
`runtime/zero/stage3.py` (`_create_fp32_partitions` and the ratio split of sub-groups, `grad_partitions_flat_buffer`
in the model dtype, per-sub-group fp32 gradients); torch 2.13 `torch/optim/adamw.py` / `adam.py` (lazy state at the
first step; `_multi_tensor_adam` holds one full temporary from `_foreach_sqrt`); torch FSDP2 `fully_shard`
(`MixedPrecisionPolicy`, `CPUOffloadPolicy`), torchtitan's grouping (embedding, each block, norm+output); torch FSDP1
`torch/distributed/fsdp/_flat_param.py` and `_runtime_utils.py` (flat parameters, FULL_SHARD, `CPUOffload`).
Left out: optimizer step counters and scalars, DeepSpeed's transient copies at initialisation, the allgather bucket
of ZeRO-1/2 with several GPUs, NCCL's own buffers, the CUDA context (~0.5 GiB per GPU), allocator fragmentation.
Checked against dry runs (`python -m helpers.bench dryrun`) and against DeepSpeed 0.19.8 and FSDP2 themselves on
scaled twins (`python -m helpers.bench scaled`); where they disagreed, the items were corrected.
"""

from __future__ import annotations

import dataclasses
import math

from helpers import versions
from helpers.deepspeed_rules import first_host_group, largest_partition_piece, zero3_sub_groups
from helpers.degrees import ceil_div
from helpers.estimate import adapters, quantized, sft_loss
from helpers.estimate.items import (
    ALWAYS,
    BWD_DONE,
    BWD_END,
    BWD_HEAD,
    BWD_POST,
    BWD_START,
    FORWARD_INIT,
    FORWARDS,
    FWD_BWD,
    GATHER,
    GRADS,
    LOSS,
    MOMENTS,
    START,
    STATES,
    STEP,
    STEP_NORM,
    STEP_PREPARE,
    Item,
)
from helpers.models import ModelSpec, Tensor, lora_shape
from helpers.training import LOGPS_RUNS, TrainSetup

FROM_FORWARD_INIT = frozenset(MOMENTS[MOMENTS.index("forward_init"):])   # an engine's lazy buffers, kept from then on


class Builder:
    """Collects items; host items are given per rank and counted for every rank on the node."""

    def __init__(self, setup: TrainSetup):
        self.setup = setup
        self.items: list[Item] = []
        self.base: ModelSpec | None = None
        """With LoRA under a strategy that shards parameters: the whole model (the items' `m` is its adapters)."""

    def gpu(self, name, category, nbytes, moments, why="", pinned=False, blocks=None):
        """A buffer on each GPU (`pinned` and `blocks` are accepted so callers can place either way)."""
        if nbytes > 0:
            self.items.append(Item(name, category, "gpu", int(nbytes), frozenset(moments), why))

    def host(self, name, category, per_rank_bytes, moments, why="", pinned=False, blocks=None):
        """A host buffer of every rank on the node; `blocks` are its pinned allocations (bytes) per rank."""
        n = self.setup.ranks_per_node
        if per_rank_bytes > 0:
            label = f"{name} (x{n} ranks)" if n > 1 else name
            pinned_blocks = tuple(list(blocks or [int(per_rank_bytes)]) * n) if pinned else ()
            self.items.append(Item(label, category, "host", int(per_rank_bytes) * n, frozenset(moments), why,
                                   pinned_blocks))


def dtype_bytes(setup: TrainSetup) -> tuple[int, int]:
    """(compute bytes, storage bytes of the weights the optimizer updates) per element. With LoRA those are the
    adapters: fp32 or in the base's dtype as `TrainSetup.adapters_fp32` says (peft's autocast_adapter_dtype, an
    engine's own cast)."""
    compute = 4 if setup.precision == "fp32" else 2
    if setup.lora_rank is not None and setup.strat.adapter_dtype:
        return compute, 4 if setup.adapters_fp32 else 2
    storage = 2 if setup.precision == "bf16" else 4
    return compute, storage


def add_model_states(b: Builder, m: ModelSpec) -> None:
    """Add the items of parameters, master weights, gradients, optimizer states and engine buffers.

    With LoRA the frozen base is one item, and the strategy's own rules apply to the adapters alone: they are the
    only parameters with gradients, master weights and optimizer states.
    """
    s = b.setup
    if s.lora_rank and s.quantized:
        codes, rest = quantized.nf4_base_bytes(m, s.double_quant)
        compute, _ = dtype_bytes(s)
        b.gpu("frozen base: 4-bit NF4 linear weights and their quantisation state", "parameters", codes, ALWAYS,
              f"bitsandbytes Linear4bit on {len(quantized.nf4_tensors(m))} linear layers: 0.5 byte per weight, "
              + ("uint8 absmax per 64, fp32 absmax per 256 of those, offset and code books (double quantisation)"
                 if s.double_quant else "fp32 absmax per 64 and the NF4 code book (no double quantisation)"))
        experts = any(t.ndim == 3 for t in m.tensors)
        b.gpu(f"frozen base: embedding, norms, output head{' and the MoE experts' if experts else ''} "
              f"({'fp32' if compute == 4 else s.half})", "parameters", rest * compute, ALWAYS,
              "not quantised by transformers' bitsandbytes integration (it replaces nn.Linear only); kept in the "
              "compute dtype" + ("; the routed experts are 3-D parameters on transformers 5, no nn.Linear (a tiny "
                                 "Mixtral loaded in 4 bits keeps them in bf16)" if experts else ""))
        m = lora_adapters(m, s.lora_rank, s.lora_targets, adapters.converted(m, s))
    elif s.lora_rank and "parameters" in s.strat.shards:
        compute, _ = dtype_bytes(s)
        dt = "fp32" if compute == 4 else "bf16"
        place = b.host if s.offload_params else b.gpu
        if s.strat.engine == "fsdp2":
            part = [fsdp2_shard(t, s.degrees.shard) for t in m.tensors]
            why = ("fully_shard shards every parameter, frozen ones too: each rank keeps a dim-0 chunk padded to "
                   "ceil(rows/N) rows (_fsdp_param.py _init_sharded_param), in the dtype the base was loaded in"
                   + ("; CPUOffloadPolicy: on the host" if s.offload_params else ""))
        elif s.strat.engine == "fsdp1":
            part = [ceil_div(n, s.degrees.shard) for n in fsdp1_units(m)]
            why = ("peft's fsdp_auto_wrap_policy: each decoder layer's frozen weights one FlatParameter, the embedding, "
                   "final norm and head the root's, each padded to a multiple of the world size and 1/N kept, in the "
                   "dtype the base was loaded in" + ("; CPUOffload: on the host" if s.offload_params else ""))
        else:
            part = [s.degrees.split(t.numel) for t in m.tensors]
            why = "ZeRO-3 partitions every parameter, frozen ones too (1/N each)" + \
                ("; offload_param: on the host" if s.offload_params else "")
        place(f"frozen base partitions ({dt})", "parameters", sum(part) * compute, ALWAYS, why,
              pinned=s.offload_params and s.pin_memory, blocks=[n * compute for n in part])
        b.base = m
        m = lora_adapters(m, s.lora_rank, s.lora_targets, adapters.converted(m, s))
    elif s.lora_rank:
        compute, _ = dtype_bytes(s)
        stored = 4 if s.base_fp32 else compute
        b.gpu(f"frozen base weights ({'fp32' if stored == 4 else s.half})", "parameters", m.params * stored, ALWAYS,
              "LoRA: the base model is frozen (no gradients, no optimizer states), "
              + ("loaded in float32 and computed under autocast (base_weights 'fp32')" if s.base_fp32
                 else "loaded in the compute dtype"))
        m = lora_adapters(m, s.lora_rank, s.lora_targets, adapters.converted(m, s))
    MODEL_STATES[s.strat.family](b, m)
    if s.tensor_parallel > 1 and not s.lora_rank and not s.strat.sharded:      # (FSDP2's is in _fsdp2)
        _embedding_backward_tp(b, m)


def _embedding_backward_tp(b: Builder, m: ModelSpec) -> None:
    """Under tensor parallelism (`m` one TP rank's share) the embedding's backward runs as DTensor's sharding rule
    for a Shard(0) (RowwiseParallel) embedding dispatches it: embedding_dense_backward over the whole vocabulary, its
    rows of this rank then copied out (seen in dry runs on torch 2.13: a (vocab, hidden) gradient on each rank)."""
    _, storage = dtype_bytes(b.setup)
    tp = b.setup.tensor_parallel
    b.gpu("embedding's gradient over the whole vocabulary (DTensor's embedding backward)", "temporaries",
          m.vocab * tp * m.hidden * storage, BWD_DONE,
          f"embedding_dense_backward with the global vocabulary ({m.vocab * tp:,} rows), before this rank's "
          f"{m.vocab:,} rows are kept")


def fsdp2_shard(t: Tensor, world: int) -> int:
    """Elements of one rank's shard of `t` under FSDP2: torch.chunk along dim 0, every shard padded to the first
    chunk's ceil(rows / world) rows (`_fsdp_param.py` `_init_sharded_param`: padded_sharded_param_size); a LoRA A of
    rank 8 on 16 ranks keeps one whole row per rank, not half of one."""
    if not t.shape:
        return ceil_div(t.numel, world)
    return ceil_div(t.shape[0], world) * (t.numel // t.shape[0])


def fsdp2_groups(m: ModelSpec, world: int) -> dict[str, int]:
    """Elements each group ('embed', 'layer.N', 'head') all-gathers under FSDP2: its padded shards x `world`."""
    out: dict[str, int] = {}
    for t in m.tensors:
        out[t.group] = out.get(t.group, 0) + fsdp2_shard(t, world) * world
    return out


def fsdp2_padding(m: ModelSpec, setup: TrainSetup) -> dict | None:
    """Under FSDP2, the tensors with fewer rows than the ranks sharding them (an MoE's experts on more ranks than
    experts): {'tensors', 'example', 'rows', 'ranks', 'times'}, where each rank keeps a whole padded row of each
    (`fsdp2_shard`) and `times` is what that holds against numel / N; None where nothing is padded so."""
    if setup.strategy != "fsdp2" or setup.degrees.shard < 2:
        return None
    G = setup.degrees.shard
    short = [t for t in m.tensors if t.shape and t.shape[0] < G]        # (their padded shards: fsdp2_shard)
    if not short:
        return None
    big = max(short, key=lambda t: t.numel)
    held = sum(fsdp2_shard(t, G) for t in short)
    return {"tensors": len(short), "example": big.name, "rows": big.shape[0], "ranks": G,
            "times": held / sum(ceil_div(t.numel, G) for t in short)}


def lora_adapters(m: ModelSpec, rank: int, targets: str = "all-linear", converted: bool = False) -> ModelSpec:
    """The LoRA adapters of `m` as a model of their own: A (rank x in) and B (out x rank) for every target (an MoE's
    3-D experts, where peft converts their names: one stacked pair per weight, `models.lora_shape`); a reward model's
    score head (helpers.estimate.reward) is trained whole beside them, a copy in peft's modules_to_save."""
    tensors = []
    for t in m.lora_targets(targets, converted):
        r, in_f, out_f = lora_shape(t, rank)
        tensors.append(Tensor(f"{t.name}.lora_A", r * in_f, t.group, 2, (r, in_f), True))
        tensors.append(Tensor(f"{t.name}.lora_B", out_f * r, t.group, 2, (out_f, r), True))
    tensors += [dataclasses.replace(t, name="score.modules_to_save.weight") for t in m.tensors
                if t.name == "score.weight"]
    return dataclasses.replace(m, name=f"{m.name} LoRA r{rank}", tensors=tuple(tensors), tied=False)


BNB_BLOCK = 256            # bitsandbytes 0.50 Optimizer2State.init_state: blockwise absmax per 256 elements
BNB_MIN_8BIT = 4096        # min_8bit_size: smaller tensors keep fp32 states
BNB_QMAPS = 2 * 256 * 4    # the signed and unsigned 8-bit code books (fp32, shared by every tensor)


def adamw8bit_state_bytes(m: ModelSpec) -> int:
    """bitsandbytes AdamW8bit's states over the model's own tensors (see `adamw8bit_bytes`)."""
    return adamw8bit_bytes([t.numel for t in m.tensors])


def adamw8bit_bytes(sizes: list[int]) -> int:
    """bitsandbytes AdamW8bit's states over tensors of these sizes (elements): two uint8 tensors and two fp32 absmax
    vectors per tensor of at least 4096 elements, two fp32 tensors for the smaller ones, and the two code books."""
    total = 0
    for n in sizes:
        total += 2 * n + 2 * 4 * math.ceil(n / BNB_BLOCK) if n >= BNB_MIN_8BIT else 2 * 4 * n
    return total + (BNB_QMAPS if any(n >= BNB_MIN_8BIT for n in sizes) else 0)


def _optimizer_states(b: Builder, m: ModelSpec, elements: int, state_bytes: int, device: str) -> None:
    """The optimizer's states (lazy: made at the first step) and its step temporaries."""
    add = b.gpu if device == "gpu" else b.host
    if b.setup.optimizer == "adamw-8bit":
        add("AdamW8bit states (uint8 x 2 + fp32 absmax per 256)", "optimizer_states", adamw8bit_state_bytes(m),
            STATES, "bitsandbytes Optimizer2State: block-wise 8-bit exp_avg and exp_avg_sq, fp32 below 4096 elements")
        return
    dt = {2: "bf16", 4: "fp32"}[state_bytes]
    add(f"AdamW exp_avg + exp_avg_sq ({dt})", "optimizer_states", 2 * elements * state_bytes, STATES,
        "created lazily at the first step, in the parameters' dtype")
    _adam_temporary(b, m, elements, state_bytes, device)


def _adam_temporary(b: Builder, m: ModelSpec, elements: int, state_bytes: int, device: str,
                    largest: int | None = None, impl: str | None = None, over: str = "", source: str = "") -> None:
    """torch AdamW's step temporaries: foreach holds one full-size tensor list (`elements`: what one step call
    updates; two before torch 2.1), for-loop two of the largest tensor where the call steps one (`largest`), else
    two of a tensor and the one before it (`ModelSpec.for_loop_adam_params`), fused none.
    `impl`: the implementation (else the set-up's); `over`: what the tensors are, for the label; `source`: where
    that optimizer is made, added to the item's why."""
    impl = impl or b.setup.adam
    two = impl == "foreach" and versions.older(b.setup, "foreach_adamw_two_lists")
    if two:
        nbytes, why = (2 * elements * state_bytes,
                       "_multi_tensor_adamw before torch 2.1: _foreach_sqrt(exp_avg_sq) and denom = "
                       "_foreach_add(exp_avg_sq_sqrt, eps), two full copies at once")
    elif impl == "foreach":
        nbytes, why = elements * state_bytes, "_multi_tensor_adamw: _foreach_sqrt(exp_avg_sq) materialises a full copy"
    elif impl == "for-loop":
        nbytes, why = ((2 * largest if largest else m.for_loop_adam_params) * state_bytes,
                       "_single_tensor_adamw: denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps) holds "
                       "the sqrt and the quotient of a tensor at once" + (
                           "" if largest else ", beside the previous tensor's denom (still bound until replaced): "
                           "2 x a tensor + the one before it, at their largest"))
    else:
        return
    add = b.gpu if device == "gpu" else b.host
    add(f"AdamW {impl} temporar{'ies' if two else 'y'}{over}{' (two lists, torch before 2.1)' if two else ''}",
        "temporaries", nbytes, STEP, why + (f" ({source})" if source else ""))


def _zero_optimizer(b: Builder, m: ModelSpec, sizes: list[int]) -> None:
    """The GPU optimizer of a ZeRO stage without optimizer offload, over DeepSpeed's flat fp32 tensors of these sizes
    (ZeRO-1/2: this rank's partition; ZeRO-3: its sub-groups, one `optimizer.step()` each: stage3.py
    `_optimizer_step`). DeepSpeed's own FusedAdam (an `optimizer` block in the JSON) works in place; the HF Trainer's
    optimizer handed to DeepSpeed as a client (transformers `integrations/deepspeed.py` deepspeed_optim_sched, with no
    `optimizer` block) keeps its own temporaries, now over a whole flat partition or sub-group at once: torch AdamW
    foreach one fp32 copy of it, for-loop two; bitsandbytes AdamW8bit keeps 8-bit states of each flat tensor."""
    impl, zero3 = b.setup.adam, "parameters" in b.setup.strat.shards
    # ZeRO-1/2 prepare each step (flattened bf16 gradients, their fp32 cast) beside the states the first update made
    alive = STATES if zero3 else STATES | STEP_PREPARE
    if impl == "bitsandbytes":
        b.gpu("AdamW8bit states of the flat fp32 partitions (uint8 x 2 + fp32 absmax per 256)", "optimizer_states",
              adamw8bit_bytes(sizes), alive, "the HF Trainer's adamw_bnb_8bit handed to DeepSpeed: bitsandbytes "
              "Optimizer2State on each flat fp32 tensor it steps, lazy at the first step")
        return
    client = b.setup.client_optimizer
    who = f"the HF Trainer's torch AdamW ({impl}) handed to DeepSpeed" if client else "FusedAdam"
    b.gpu("Adam exp_avg + exp_avg_sq (fp32)", "optimizer_states", sum(sizes) * 8, alive,
          f"{who}, lazy at the first step; from the second step on alive while a step prepares")
    if client:
        _adam_temporary(b, m, max(sizes), 4, "gpu", largest=max(sizes),
                        over=" over a flat fp32 " + ("sub-group" if zero3 else "partition"))


def head_unused(s) -> bool:
    """The LM head runs in the forward but not in the loss (a value-head reward model, helpers.estimate.reward): its
    weight's 16-bit copy lives through the forward alone, and backward makes it no gradient (counted anyway where the
    engine keeps one: an upper bound)."""
    return s.run == "rm" and s.rm_head == "value-head"


def _head_gradient(b: Builder, m: ModelSpec, nbytes_per: int) -> None:
    """The output head's weight gradient: the first one backward makes, whole, before any hook can shard it."""
    if head_unused(b.setup):
        return
    head = m.group_params["embed"] if m.tied else m.lm_head_params
    b.gpu("output head's gradient (the first one made)", "gradients", head * nbytes_per, BWD_HEAD,
          "autograd makes it whole before a gradient hook can partition it")


def _torch_replicated(b: Builder, m: ModelSpec) -> None:
    s, P = b.setup, m.params
    compute, storage = dtype_bytes(s)
    dt = {2: "bf16", 4: "fp32"}
    if s.lora_rank:
        b.gpu(f"LoRA adapters ({dt[storage]})", "parameters", P * storage, ALWAYS,
              "the adapters' weights (the frozen base is its own item)")
    else:
        b.gpu(f"parameters ({dt[storage]})", "parameters", P * storage, ALWAYS, "the model's own weights")
    unused = head_unused(s)
    embed = 0 if m.tied and not unused else m.group_params.get("embed", 0)    # (a tied weight whose head takes no
    #                                                                           gradient: the embedding's, last)
    head = m.group_params["embed"] if m.tied else m.lm_head_params
    head_called = sft_loss.mechanism(s) == sft_loss.FULL    # (TRL's chunked/tiled loss reads the head's weight
    # itself and casts it chunk by chunk: helpers.estimate.activations)
    if s.mixed and s.checkpointing == "none":
        b.gpu(f"{s.half} weight copies (autocast cache, saved for backward)", "temporaries",
              (m.matmul_params - (0 if head_called and not unused else head)) * 2,
              FORWARDS | BWD_START | BWD_HEAD, "torch.autocast caches the bf16 cast of each fp32 matmul weight (not the "
              "embedding or norms); matmuls save it for backward")
        if unused:
            b.gpu(f"{s.half} copy of the output head's weight (its logits unused)", "temporaries", head * 2, FORWARDS,
                  "cast for the head's matmul in the forward; nothing keeps it for backward")
    elif s.mixed:
        weights = {g: sum(t.numel for t in m.tensors if t.group == g and t.ndim >= 2) for g in m.group_params
                   if g.startswith("layer.")}
        layer, every = max(weights.values()), s.checkpoint_every
        b.gpu(f"{s.half} weight copies of the layers (autocast cache)", "temporaries", (m.matmul_params - head) * 2,
              FORWARDS - LOSS if s.run in LOGPS_RUNS else FORWARDS,
              "cached while autocast is on; checkpointed layers save none for backward, so they go when forward ends"
              + (f" ({s.run.upper()} scores its logits after the forward, with the cache gone: accelerate's "
                 f"autocast wraps each forward, and its exit clears the cache)" if s.run in LOGPS_RUNS else ""))
        if every > 1:
            kept = sum(n for g, n in weights.items() if (int(g.split(".")[1]) + 1) % every)
            b.gpu(f"{s.half} weight copies of the layers not checkpointed, saved for backward", "temporaries", kept * 2,
                  BWD_START | BWD_HEAD, f"checkpointing every {every}th layer: the others' matmuls keep their casts")
            if m.layers % every == 0:
                b.gpu(f"{s.half} weight copies of the last layer, recomputed", "temporaries", layer * 2, BWD_HEAD,
                      "the last layer is checkpointed: its recomputation casts its weights again")
        if head_called:
            b.gpu(f"{s.half} copy of the output head's weight, saved for backward", "temporaries", head * 2,
                  FORWARDS if unused else FORWARDS | BWD_START | BWD_HEAD,
                  "the head is not checkpointed: its matmul keeps the cast" + (" while its (unused) logits live"
                                                                               if unused else ""))
        b.gpu(f"{s.half} weight copies of the layer being recomputed", "temporaries", layer * 2, BWD_END,
              "recomputation casts one layer's weights again")
    b.gpu(f"gradients ({dt[storage]})" + (", all but the embedding's" if embed else ""), "gradients",
          (P - embed) * storage, GRADS, "param.grad, freed by zero_grad()")
    b.gpu(f"embedding gradient ({dt[storage]})", "gradients", embed * storage, BWD_DONE | STEP_NORM | STEP,
          "the embedding's backward runs last")
    if m.tied and not unused:
        b.gpu("tied embedding: its gradient and the earlier one, before they are summed", "temporaries",
              2 * m.group_params["embed"] * storage, BWD_DONE,
              "AccumulateGrad adds the embedding's contribution to the head's out of place")
    _head_gradient(b, m, storage)
    if s.precision == "fp16-mixed":
        b.gpu("GradScaler: loss scale, growth tracker and found_inf", "optimizer_states", 12,
              ALWAYS - {"setup", "resume", "forward_init", "forward_start", "forward_gather", "forward"},
              "torch.amp.GradScaler (torch 2.13 amp/grad_scaler.py): an fp32 scale and an int32 growth tracker made at "
              "the first scale(), an fp32 found_inf per device at each unscale_(), which unscales the gradients in "
              "place (_amp_foreach_non_finite_check_and_unscale_)")
    if s.strat.gradient_buckets:
        b.gpu("DDP gradient buckets", "comm_buffers", P * storage, ALWAYS,
              "DistributedDataParallel's reducer buckets (gradient_as_bucket_view=False, the default)")
    _optimizer_states(b, m, P, storage, "gpu")


def fsdp2_reduce_bytes(s: TrainSetup) -> int:
    """Bytes per element FSDP2 reduces gradients in: fp32 without a policy (fp32 training), bf16 in pure bf16, and
    under bf16-mixed the policy's reduce_dtype (fp32 torchtitan's, bf16 accelerate's)."""
    return 2 if s.precision == "bf16" or (s.precision == "bf16-mixed" and s.reduce_dtype == "bf16") else 4


def _fsdp2(b: Builder, m: ModelSpec) -> None:
    """FSDP2 as torchtitan groups it: the embedding, each block, norm + output head (a tied head shares the
    embedding's group). Each moment below was located in dry runs."""
    if b.base is not None:
        return _fsdp2_lora(b, m)
    s, G = b.setup, b.setup.degrees.shard     # (with TP, `m` is one TP rank's share)
    compute, storage = dtype_bytes(s)
    off = s.offload_params
    r = fsdp2_reduce_bytes(s)
    shards = [fsdp2_shard(t, G) for t in m.tensors]         # padded dim-0 chunks: an 8-expert tensor on 16 ranks
    shard = sum(shards)                                      # keeps one whole expert per rank, not half of one
    place = b.host if off else b.gpu
    blocks = [n * storage for n in shards]
    gp = fsdp2_groups(m, G)                                  # what each group all-gathers: its padded shards x N
    layers = [v for k, v in gp.items() if k.startswith("layer.")]
    first = gp["embed"] + (gp["head"] if m.tied else 0)
    head = first if m.tied else gp["head"]
    order = [first] + layers + [head]                       # the order groups are gathered in forward
    layer = max(layers)
    dt = " (fp32)" if storage == 4 else " (bf16)"
    place("sharded parameters" + dt, "parameters", shard * storage, ALWAYS,
          "fully_shard keeps 1/N of each parameter as a DTensor shard" + ("; CPUOffloadPolicy: on the host" if off else ""),
          pinned=off and s.pin_memory, blocks=blocks)
    gather = max(2 * g + prev for prev, g in zip([0] + order[:-1], order))
    tied = m.tied and s.tensor_parallel == 1
    if tied:             # the group of embedding and head stays unsharded until the head has run
        gather = _tied_group_in_forward(b, first, layers, compute)
    b.gpu("all-gather of a group (buffer + unsharded copy) beside the previous group"
          + (" and the unsharded embedding and head" if tied else ""), "temporaries", gather * compute,
          GATHER, "foreach_all_gather output and its copy-out coexist until the copy is done")
    if s.tensor_parallel == 1:
        if tied:
            b.gpu("all-gather output of the last block, held while the loss is computed", "temporaries",
                  layers[-1] * compute, LOSS, "the tied embedding and head's group is resharded by its post-forward "
                  "hook before the loss; the last all-gather's output is held until the next all-gather is issued "
                  "(comm_ctx.all_gather_state)")
        else:
            b.gpu("unsharded output head", "temporaries", head * compute, LOSS,
                  "the head's group while the loss is computed")
    # (with TP the loss is computed after the model's forward, as torchtitan's train step does
    # (`torchtitan/train.py` forward_backward_step at 238fa9953e4a): the head's group is resharded by then)
    _fsdp2_kept(b, first, layers, head, tied, compute)
    grads = [v for k, v in m.group_params.items() if k.startswith("layer.")]    # unpadded: what autograd makes
    held = off and s.degrees.dp_replicate > 1   # HSDP: each group's reduce-scatter output kept on the GPU (below)
    not_yet = _fsdp2_backward_ends(b, head, layers, grads, first, tied, G, compute,
                                   r if held else 0 if off else storage, r,
                                   head_moment=s.reshard_after_forward or not tied)
    tp = s.tensor_parallel
    if tied:
        b.gpu("tied embedding and head's group at the end of backward: the unsharded weight, the head's gradient held "
              "since the head's backward, the embedding's gradient and their sum (then the sum and its reduce-scatter "
              "input)", "temporaries", max(4 * first * compute, 2 * first * compute + first * r), BWD_DONE,
              "the group's post-backward (its reduce-scatter) runs only after the embedding's backward, the last; the "
              "two gradients of the one weight are added out of place first (seen in dry runs)")
        b.gpu("the last block's reduce-scatter input, held until the root's post-backward", "comm_buffers", layer * r,
              BWD_DONE, "comm_ctx.reduce_scatter_state keeps it until the next reduce-scatter is issued")
    elif tp == 1:
        b.gpu("unsharded embedding in backward, and its reduce-scatter input", "comm_buffers", first * (compute + r),
              BWD_DONE, "the last group to run backward")
    else:
        b.gpu("embedding's backward under TP: its unsharded shard, DTensor's gradient over the whole vocabulary and "
              "this rank's rows of it, beside the last block's reduce-scatter input", "temporaries",
              first * compute * (2 + tp) + layer * r, BWD_DONE,
              "a Shard(0) embedding's backward runs embedding_dense_backward with the global vocabulary, then keeps "
              "this rank's rows (seen in 2-D dry runs, torch 2.13); the peak comes before its own reduce-scatter")
    in_first = [t.group == "embed" or (m.tied and t.group == "head") for t in m.tensors]
    rest_blocks = [b_ for b_, f in zip(blocks, in_first) if not f]
    first_blocks = [b_ for b_, f in zip(blocks, in_first) if f]
    if held:
        _hsdp_offload_held(b, sum(n for n, f in zip(shards, in_first) if not f) * r, not_yet,
                           sum(n for n, f in zip(shards, in_first) if f) * r if tp == 1 and not tied else 0)
    elif not_yet:
        b.gpu("sharded gradients of the first blocks, made after that post-backward", "gradients", not_yet,
              GRADS - BWD_POST, "the blocks before the one whose post-backward is the end's peak")
    place("sharded gradients" + dt + ", all but the embedding's", "gradients",
          sum(rest_blocks) - (0 if held else not_yet), GRADS,
          "reduce-scattered into 1/N shards" + ("; copied to the host" if off else ""),
          pinned=off and s.pin_memory, blocks=rest_blocks)
    at_end = BWD_DONE if tp == 1 and (off or not tied) else set()
    if s.grad_accum > 1 and s.sync_each_batch:      # the earlier micro batches' sum, alive through the later ones
        at_end = at_end | FWD_BWD | BWD_POST | BWD_DONE
    place("sharded gradient of the embedding", "gradients", sum(first_blocks), at_end | STEP_NORM | STEP,
          "its group runs backward last" + ("; a tied one's GPU peak comes before its reduce-scatter" if tied else ""),
          pinned=off and s.pin_memory, blocks=first_blocks)
    place("AdamW exp_avg + exp_avg_sq (sharded)", "optimizer_states", 2 * shard * storage, STATES,
          "torch AdamW on the shards" + ("; the step runs on the CPU" if off else ""))
    _adam_temporary(b, m, shard, storage, "host" if off else "gpu")


def _fsdp2_kept(b: Builder, first: int, layers: list[int], head: int, tied: bool, compute: int,
                frozen: bool = False) -> None:
    """FSDP2 with reshard_after_forward=False: a group's post-forward does not free its unsharded parameters (torch
    2.13 `_fsdp_param_group.py` post_forward reshards only with post_forward_mesh_info), so every group stays
    unsharded from its forward to its own backward, whose post-backward frees it; the backward's all-gathers find
    them unsharded and gather nothing. Group sizes in elements (padded, as gathered). The all-gather being issued and
    the last one's output are counted by the items beside this. `frozen`: LoRA's frozen base, whose head makes no
    gradient and no post-backward, so the start of backward holds every group until the last block's backward.
    Located in dry runs."""
    if b.setup.reshard_after_forward:
        return
    how = "reshard_after_forward=False: each group's all-gathered parameters stay until its backward"
    b.gpu("groups kept unsharded after their forward, before the one being gathered", "temporaries",
          (sum(layers[:-1]) if tied else first + sum(layers)) * compute, GATHER, how)
    b.gpu("every group kept unsharded after its forward", "temporaries",
          (first + sum(layers) + (0 if tied else head)) * compute, LOSS | BWD_START | (BWD_HEAD if frozen else set()),
          how)
    if frozen:
        return
    if tied:
        b.gpu("every group kept unsharded after its forward, and the tied head's unsharded gradient", "temporaries",
              (2 * first + sum(layers)) * compute, BWD_HEAD, how + "; the tied group's gradient waits for the "
              "embedding's backward, the last, before its reduce-scatter, and no all-gather is issued")
    else:
        b.gpu("every group but the last block kept unsharded after its forward (the head's post-backward and the last "
              "block are counted beside)", "temporaries", (first + sum(layers[:-1])) * compute, BWD_HEAD, how)


def _hsdp_offload_held(b: Builder, rest: int, not_yet: int, embed: int) -> None:
    """HSDP with CPUOffloadPolicy: a group's reduce-scatter output (reduce dtype, on the GPU) is all-reduced across
    the replicas and copied to the host, but FSDPParamGroup._all_reduce_state keeps a reference to it until
    finalize_backward (torch 2.13 `_fsdp_param_group.py` post_backward, AllReduceState: "keeps the caching allocator
    from reusing the block across layers", PR #140044), so every group's stays on the GPU until backward ends. Bytes:
    `rest` the blocks' and head's, `not_yet` those not made at the post-backward moment, `embed` the embedding's
    (made last; 0 for a tied one, whose group's peak comes before its reduce-scatter). Without offload the output
    is the sharded gradient itself and adds nothing. Seen in dry runs."""
    why = ("HSDP: each group's reduce-scatter output, all-reduced across replicas and copied to the host, is held on "
           "the GPU by _all_reduce_state until finalize_backward")
    if not_yet:
        b.gpu("reduce-scatter outputs of the first blocks (HSDP), made after that post-backward", "gradients", not_yet,
              BWD_END | BWD_DONE, why)
    b.gpu("reduce-scatter outputs held for the all-reduce across replicas (HSDP)", "gradients", rest - not_yet,
          BWD_END | BWD_POST | BWD_DONE, why)
    if embed:
        b.gpu("the embedding's reduce-scatter output (HSDP)", "gradients", embed, BWD_DONE, why)


def _fsdp2_backward_ends(b: Builder, head: int, layers: list[int], grads: list[int], first: int, tied: bool, G: int,
                         compute: int, storage: int, r: int, head_moment: bool = True) -> int:
    """The two ends of backward (group sizes in elements: `layers` padded as FSDP2 gathers them, `grads` the blocks'
    own sizes, as autograd makes their gradients). Between them activations are freed as gradients are made, so a
    moment in the middle holds less than one of its ends.

    At its start (every activation saved, BWD_HEAD): the output head's backward, with the last block prefetched, or
    the last block's post-backward, whichever holds more. At its end: the first block's backward with the embedding
    prefetched (BWD_END, beside that block's activations), and, at a moment of its own (BWD_POST, those freed), the
    post-backward of the block that holds the most once the sharded gradients not yet made are left out.
    A block's post-backward (torch 2.13 `_fsdp_param_group.py` post_backward: reshard, then `foreach_reduce`) holds
    its unsharded gradients, the block before it prefetched (all-gather output and unsharded copy) and the
    reduce-scatter input (reduce dtype, padded). A dense model's head and embedding outweigh a block; an MoE block,
    whose experts are padded to a whole expert per rank once there are more ranks than experts (`fsdp2_shard`), does
    not: dry runs of Mixtral-8x7B on 16 ranks and Qwen1.5-MoE-A2.7B on 64 peaked in a block's post-backward.
    `storage`: bytes per element of a sharded gradient on the GPU (0 when they go to the host). Returns the bytes of
    the sharded gradients not yet made at the end's moment (the blocks before the one chosen). `head_moment` False:
    the caller counts the start of backward (`_fsdp2_kept`)."""
    groups = [first] + layers                               # what each block's pre-backward prefetches: the group before

    def post_backward(k: int) -> tuple[int, int]:          # block k: (temporaries, reduce-scatter input) in elements
        return layers[k] + groups[k] + grads[k], layers[k]

    def held(tc: tuple[int, int]) -> int:
        return tc[0] * compute + tc[1] * r

    head_grad = 0 if tied else ceil_div(head, G)           # a tied head's group is reduced last
    t, c = post_backward(len(layers) - 1)
    cast = ceil_div(head, G) * 4 if r == 2 and b.setup.precision == "bf16-mixed" else 0     # bf16 reduce, fp32 shards
    if not head_moment:
        pass
    elif (head + layers[-1]) * compute + (head + ceil_div(head, G)) * r + cast >= held((t, c)) + head_grad * storage:
        b.gpu("unsharded gradient of the head, and the next group prefetched", "temporaries",
              (head + layers[-1]) * compute, BWD_HEAD, "the head's backward, with the last block's all-gather prefetched")
        b.gpu("reduce-scatter of the head: input and output" + (", and the output cast to fp32" if cast else ""),
              "comm_buffers", head * r + ceil_div(head, G) * r + cast, BWD_HEAD,
              f"gradients reduced in {'fp32' if r == 4 else 'bf16'} (reduce_dtype)" + (
                  "; foreach_reduce casts the output to the fp32 shard's dtype (_to_dtype_if_needed) before it "
                  "becomes the sharded gradient" if cast else ""))
    else:
        b.gpu("the last block's post-backward: its unsharded parameters and gradients, and the block before it "
              "prefetched", "temporaries", t * compute, BWD_HEAD,
              "every activation still saved; it holds more than the head's backward here")
        b.gpu("reduce-scatter input of the last block", "comm_buffers", c * r, BWD_HEAD,
              f"its gradients copied in, in {'fp32' if r == 4 else 'bf16'} (reduce_dtype)")
        if head_grad:
            b.gpu("the head's sharded gradient", "gradients", head_grad * storage, BWD_HEAD, "its reduce-scatter output")

    def at_end(k: int) -> int:                               # blocks before k have not run backward yet
        return held(post_backward(k)) - sum(layers[:k]) // G * storage

    layer = max(layers)
    b.gpu("unsharded first block, and the embedding prefetched", "temporaries", (layer + first) * compute, BWD_END,
          "the first block's backward, its activations and working set still alive")
    b.gpu("reduce-scatter input of a block", "comm_buffers", layer * r, BWD_END, "")
    k = max(range(len(layers)), key=at_end)
    t, c = post_backward(k)
    b.gpu("a block's post-backward: its unsharded parameters and gradients, and the group before it prefetched",
          "temporaries", t * compute, BWD_POST, "after the block's backward (its activations freed), before its "
          "reduce-scatter output: the first block's (the embedding prefetched), or another's where blocks outweigh it")
    b.gpu("reduce-scatter input of that block", "comm_buffers", c * r, BWD_POST, "")
    return sum(layers[:k]) // G * storage


def _fsdp2_lora(b: Builder, m: ModelSpec) -> None:
    """LoRA under FSDP2: peft's adapters added before fully_shard (as torchtune's distributed LoRA recipes and
    accelerate + peft do), grouped as `_fsdp2` says; `m` is the adapters, `b.base` the whole model, whose frozen
    shards add_model_states placed. Sources, torch 2.13 `torch/distributed/fsdp/_fully_shard/`: a group all-gathers
    every parameter it holds, frozen or not (`_fsdp_param_group.py` unshard), in forward and again in backward
    (reshard_after_forward); only parameters with a gradient are reduce-scattered (post_backward collects
    `unsharded_param.grad`), so the frozen embedding and head make no reduce-scatter and no sharded gradient.
    Dtypes: the base is loaded in the compute dtype, the adapters are fp32 under bf16-mixed
    (helpers.measure.engines.fp32_adapters) and MixedPrecisionPolicy casts their shards to bf16 for the all-gather
    (`_fsdp_param.py` all_gather_inputs), so every all-gather input of a group has one dtype and none is sent as
    uint8 (`_fsdp_collectives.py` `_get_param_all_gather_inputs`). Each moment below was located in dry runs."""
    s, G, base = b.setup, b.setup.degrees.shard, b.base
    compute, storage = dtype_bytes(s)
    off = s.offload_params
    r = fsdp2_reduce_bytes(s)
    place = b.host if off else b.gpu
    shards = [fsdp2_shard(t, G) for t in m.tensors]
    shard = sum(shards)
    base_groups, adapter_groups = fsdp2_groups(base, G), fsdp2_groups(m, G)
    group = lambda g: base_groups.get(g, 0) + adapter_groups.get(g, 0)     # what a group all-gathers: both
    layer_names = [k for k in base.group_params if k.startswith("layer.")]
    layers = [group(k) for k in layer_names]
    first = group("embed") + (group("head") if base.tied else 0)
    head = first if base.tied else group("head")
    order = [first] + layers + [head]                         # the order groups are gathered in forward
    adapters_rs = max(adapter_groups.get(k, 0) for k in layer_names) * r  # a block's reduce-scatter input: its adapters only
    adt = "fp32" if storage == 4 else "bf16"
    place(f"sharded LoRA adapters ({adt})", "parameters", shard * storage, ALWAYS,
          "the adapters' own dim-0 shards (_init_sharded_param)" + ("; CPUOffloadPolicy: on the host" if off else ""),
          pinned=off and s.pin_memory, blocks=[n * storage for n in shards])
    gather = max(2 * g + prev for prev, g in zip([0] + order[:-1], order))
    if base.tied:        # the group of embedding and head stays unsharded until the head has run
        gather = _tied_group_in_forward(b, first, layers, compute)
    b.gpu("all-gather of a group, frozen base and adapters (buffer + unsharded copy), beside the previous group's "
          "all-gather output" + (" and the unsharded embedding and head" if base.tied else ""), "temporaries",
          gather * compute, GATHER,
          "foreach_all_gather's output and its copy-out coexist, and the previous group's output is released only "
          "when the next all-gather is issued (comm_ctx.all_gather_state); frozen weights are gathered like "
          "trainable ones")
    b.gpu("all-gather output of the last group gathered in forward (" + ("the last block" if base.tied else "the head")
          + ")", "temporaries", (layers[-1] if base.tied else head) * compute, LOSS,
          "the head's group is resharded by its post-forward hook before the loss is computed, but the last "
          "all-gather's output is held until the next all-gather is issued (comm_ctx.all_gather_state)")
    logits_grad = 0 if s.fused_ce else s.batch * s.seq * base.vocab
    _fsdp2_kept(b, first, layers, head, base.tied, compute, frozen=True)
    if not s.reshard_after_forward:
        if logits_grad:
            b.gpu("gradient of the logits, read by the head's backward", "logits", logits_grad * compute, BWD_HEAD,
                  "the loss's backward hands the head a batch x seq x vocab gradient in the compute dtype")
    elif 2 * layers[-1] >= 2 * head + logits_grad:
        b.gpu("the last block gathered again for its backward (buffer + unsharded copy)", "temporaries",
              2 * layers[-1] * compute, BWD_HEAD, "reshard_after_forward freed it; every activation but the head's is "
              "still saved, and the block outweighs the head and the logits' gradient (an MoE block: dry runs of "
              "Mixtral-8x7B with LoRA on 16 ranks peaked there)")
    else:
        b.gpu("output head gathered again for its backward (buffer + unsharded copy)", "temporaries",
              2 * head * compute, BWD_HEAD, "reshard_after_forward freed it; the input gradient (grad_logits @ W) "
              "needs the whole weight, and a frozen head makes no weight gradient and no reduce-scatter")
        if logits_grad:
            b.gpu("gradient of the logits, read by the head's backward", "logits", logits_grad * compute, BWD_HEAD,
                  "the loss's backward hands the head a batch x seq x vocab gradient in the compute dtype; it is "
                  "alive while the head's group is gathered again, this strategy's backward peak")
    b.gpu("unsharded block in its backward (frozen base and adapters), and the block before it prefetched",
          "temporaries", max(a + p for a, p in zip(layers, [0] + layers[:-1])) * compute, BWD_END,
          "a block's backward gathers the block before it (_backward_prefetch); the first block's prefetches the "
          "embedding, counted at the end of backward")
    b.gpu("reduce-scatter input of a block's adapters", "comm_buffers", adapters_rs, BWD_END | BWD_DONE,
          f"only the adapters have gradients to reduce, in {'fp32' if r == 4 else 'bf16'} (reduce_dtype); the last "
          f"one is kept until the root's post-backward callback (reduce_scatter_states)")
    if not base.tied:
        b.gpu("embedding all-gathered in backward and never used (buffer + unsharded copy)", "temporaries",
              2 * first * compute, BWD_DONE,
              "the first block's pre_backward prefetches the group before it (_backward_prefetch), but a frozen "
              "embedding's output needs no gradient, so its group runs no backward: finalize_backward drops it")
    place(f"sharded gradients of the adapters ({adt})", "gradients", shard * storage, GRADS,
          "reduce-scattered into 1/N shards, in the adapters' dtype" + ("; copied to the host" if off else ""),
          pinned=off and s.pin_memory, blocks=[n * storage for n in shards])
    place(f"AdamW exp_avg + exp_avg_sq of the adapters (sharded, {adt})", "optimizer_states", 2 * shard * storage,
          STATES, "torch AdamW on the adapters' shards; the frozen base has none" +
          ("; the step runs on the CPU" if off else ""))
    _adam_temporary(b, m, shard, storage, "host" if off else "gpu")


def _tied_group_in_forward(b: Builder, first: int, layers: list[int], compute: int) -> int:
    """FSDP2 with a tied embedding: its group (embedding, final norm, head; `first` elements) stays unsharded from its
    all-gather until the head has run. Adds the forward's start (the first block's all-gather beside it, nothing
    saved yet) and returns what a block's all-gather holds at most beside it (elements)."""
    b.gpu("the first block's all-gather (buffer + unsharded copy) beside the embedding and head's group: its "
          "all-gather output and its unsharded copy", "temporaries", (2 * first + 2 * layers[0]) * compute, START,
          "a forward's start, nothing saved yet: the group of a tied embedding (embedding, norm, head) runs its "
          "post-forward reshard only after the head; its all-gather output is released only when the next "
          "all-gather is issued (comm_ctx.all_gather_state); located in dry runs")
    return first + max(2 * g + prev for prev, g in zip([0] + layers[:-1], layers))


def _partition_moments(m: ModelSpec, s) -> frozenset:
    """Where ZeRO-2's gradient partition is alive in a backward: DeepSpeed 0.19.8 (stage_1_and_2.py
    copy_grads_in_partition) makes `grads_in_partition` at the first reduction of the ipg bucket that holds a
    gradient of this rank's partition, i.e. once the gradients made (in backward's order: the head's, the last
    layer's, ..., the embedding's) first overflow reduce_bucket_size, or at the end of backward
    (independent_gradient_partition_epilogue). The rank whose partition holds the head and the last layers (the last
    rank; the only one on one GPU) makes it first: that rank's moments. The head's gradient is the first made, then
    the final norm's (the rest of the 'head' group) and the last layer's: a head larger than the bucket is reduced
    when the norm's gradient comes, every activation still saved (counted at BWD_HEAD, the head's backward). A tied
    head's gradient comes with the embedding's, last."""
    B = s.reduce_bucket_size
    group = lambda g: sum(t.numel for t in m.tensors if t.group == g)
    head = 0 if m.tied else group("head")
    last = max((t.numel for t in m.tensors if t.group == f"layer.{m.layers - 1}"), default=0)
    before_first = m.params - group("layer.0") - group("embed") - (group("head") if m.tied else 0)
    return (BWD_DONE | STEP_NORM | STEP_PREPARE | (BWD_HEAD if head + last > B else frozenset())
            | (BWD_END if before_first > B else frozenset()))


def _norm_copy(b: Builder, elements: int, what: str, where: str) -> None:
    """The step's gradient norm under ZeRO without optimizer offload: DeepSpeed 0.19.8 takes each gradient's norm
    from a float64 copy of it (`g.to(get_norm_dtype())`, runtime/zero/utils.py: fp64 wherever the device has it),
    one gradient at a time, before the gradients are flattened or cast for the update; the largest copy is the
    moment's. Seen in DeepSpeed itself on the twins (scaled runs: the step's peak)."""
    b.gpu("the gradient norm's float64 copy of one gradient", "gradients", elements * 8, STEP_NORM,
          f"{what}, {elements:,} elements x 8 B, alive while its norm is taken (DeepSpeed 0.19.8 {where}, "
          f"runtime/zero/utils.py get_norm_dtype)")


def _zero12(b: Builder, m: ModelSpec) -> None:
    s, P, G = b.setup, m.params, b.setup.degrees.shard
    compute, _ = dtype_bytes(s)
    part = ceil_div(P, G)
    off, pin = s.offload_optimizer, s.offload_optimizer and s.pin_memory
    dt = "bf16" if compute == 2 else "fp32"
    b.gpu(f"parameters ({dt}, full copy on every GPU)", "parameters", P * compute, ALWAYS, "ZeRO-1/2 do not shard parameters")
    place = b.host if off else b.gpu
    place("fp32 master partition", "master_weights", part * 4, ALWAYS,
          "single_partition_of_fp32_groups, 1/N of the weights in fp32" + ("; pinned" if pin else ""), pinned=pin)
    zgrads = _partition_moments(m, s)
    if "gradients" not in s.strat.shards and not off:
        b.gpu(f"gradients ({dt}, full)", "gradients", P * compute, BWD_END | BWD_DONE | STEP_NORM | STEP_PREPARE,
              "ZeRO-1 keeps every gradient until the step")
        _head_gradient(b, m, compute)
    elif not off:
        b.gpu(f"gradient partition ({dt})", "gradients", part * compute, zgrads,
              "grads_in_partition (contiguous_gradients), made when the ipg bucket is first reduced (a bucket "
              "of reduce_bucket_size elements filled, or the end of backward); step() frees it "
              "(_release_preflattened_grad_buffers) before the update runs")
        _head_gradient(b, m, compute)
    else:
        _head_gradient(b, m, compute)
    if m.tied and not head_unused(s):
        kept = "gradients" not in s.strat.shards and not off          # ZeRO-1: the sum is the gradient it keeps
        b.gpu("tied embedding at the end of backward: the head's gradient and the embedding's"
              + ("" if kept else ", and their sum"), "temporaries", (2 if kept else 3) * m.group_params["embed"] * compute,
              BWD_DONE, "one weight used twice: autograd holds the head's gradient until the embedding's backward "
                        "makes the other and adds them out of place; ZeRO's gradient hook then takes the sum (seen in "
                        "dry runs and in DeepSpeed 0.19.8 itself on a tied twin)")
    if not off:
        _norm_copy(b, largest_partition_piece([t.numel for t in m.tensors], part), "the largest piece of a gradient "
                   "in any rank's partition (a whole tensor, or its part inside the partition)", "stage_1_and_2.py "
                   "step: scaled_global_norm, get_grad_norm_direct over averaged_gradients")
        b.gpu(f"flattened gradient partition ({dt}), a local of step()", "gradients", part * compute,
              STEP_PREPARE, "flatten_dense_tensors_aligned(averaged_gradients); step() deletes it once cast to fp32, "
              "before the update (DeepSpeed 0.19.8 stage_1_and_2.py: del flat_grad_partition)")
    buckets = 2 if s.overlap else 1
    b.gpu(f"ipg reduce bucket{'s' if buckets > 1 else ''} ({dt})", "comm_buffers",
          buckets * s.reduce_bucket_size * compute, BWD_HEAD | BWD_END | BWD_DONE,
          f"reduce_bucket_size={s.reduce_bucket_size:.0e} elements, x{buckets} (overlap_comm={s.overlap}); made by the "
          f"first gradient hook, released when backward ends")
    if off:
        largest = m.largest_tensor_params * compute
        b.gpu(f"offload staging buffer ({dt}, largest parameter)", "comm_buffers", largest, ALWAYS,
              "temp_grad_buffer_for_gpu_offload")
        b.host(f"offload staging buffer ({dt}, largest parameter)", "comm_buffers", largest, ALWAYS,
               "temp_grad_buffer_for_cpu_offload" + ("; pinned" if pin else ""), pinned=pin)
        b.host(f"{dt} copy of the partition, for updated weights going back", "comm_buffers", part * compute, ALWAYS,
               "param_buffer_of_bit16_for_cpu_offload_groups" + ("; pinned" if pin else ""), pinned=pin)
    if off:
        b.host("fp32 gradient partition", "gradients", part * 4, ALWAYS,
               "made at initialize_optimizer_states, kept for the CPU optimizer" + ("; pinned" if pin else ""), pinned=pin)
        b.host("Adam exp_avg + exp_avg_sq (fp32)", "optimizer_states", part * 8, STATES, "DeepSpeedCPUAdam, lazy at the first step")
    else:
        b.gpu("fp32 gradient partition (made at the step)", "gradients", part * 4, STEP | STEP_PREPARE,
              "step(): flat bf16 partition .to(fp32) before optimizer.step")
        _zero_optimizer(b, m, [part])


def _zero3(b: Builder, m: ModelSpec) -> None:
    s, P, G = b.setup, m.params, b.setup.degrees.shard
    compute, _ = dtype_bytes(s)
    part = ceil_div(P, G)
    dt = "bf16" if compute == 2 else "fp32"
    groups = zero3_sub_groups(m, s)
    first_cpu = first_host_group(len(groups), s.ratio) if s.offload_optimizer else len(groups)
    gpu_elems, host_elems = sum(groups[:first_cpu]), sum(groups[first_cpu:])
    opt_pin = s.offload_optimizer and s.pin_memory
    split = f"sub-groups {first_cpu}..{len(groups) - 1} of {len(groups)} on the host" if s.offload_optimizer else ""

    if s.offload_params:
        b.host(f"parameter partitions ({dt})", "parameters", part * compute, ALWAYS,
               "offload_param: each partition on the host" + ("; pinned" if s.pin_memory else ""),
               pinned=s.pin_memory, blocks=[ceil_div(t.numel, G) * compute for t in m.tensors])
    else:
        b.gpu(f"parameter partitions ({dt})", "parameters", part * compute, ALWAYS, "ZeRO-3 keeps 1/N of every parameter")
    layer = m.largest_layer_params if b.base is None else \
        max(n + m.group_params.get(g, 0) for g, n in b.base.group_params.items())     # LoRA: base layer + adapters
    gathered = min(layer + s.prefetch_bucket_size, 1_000_000_000)
    b.gpu("gathered parameters in flight", "temporaries", gathered * compute, FWD_BWD,
          "the module computing plus stage3_prefetch_bucket_size (max_live_parameters caps it at 1e9)")
    separate_master = not (s.precision == "fp32" and not s.offload_optimizer)
    if separate_master:
        b.gpu("fp32 master partition", "master_weights", gpu_elems * 4, ALWAYS, split or "fp32_partitioned_groups_flat")
        b.host("fp32 master partition", "master_weights", host_elems * 4, ALWAYS, split)
    grad_place = b.host if s.offload_optimizer else b.gpu
    grad_place(f"gradient partition ({dt})", "gradients", part * compute, ALWAYS,
               "grad_partitions_flat_buffer in the model dtype, made at initialisation" + ("; pinned" if opt_pin else ""),
               pinned=opt_pin)
    b.gpu(f"ipg reduce bucket ({dt})", "comm_buffers", s.reduce_bucket_size * compute, ALWAYS,
          f"reduce_bucket_size={s.reduce_bucket_size:.0e} elements, made at initialisation")
    if s.offload_optimizer:
        b.host("fp32 gradient buffers of host sub-groups", "gradients", host_elems * 4, ALWAYS,
               "initialize_optimizer_states: one per sub-group" + ("; pinned" if opt_pin else ""),
               pinned=opt_pin, blocks=[g * 4 for g in groups[first_cpu:]])
        b.gpu("fp32 gradient buffers of GPU sub-groups", "gradients", gpu_elems * 4, ALWAYS, split)
        if opt_pin and first_cpu:
            b.host("fp32 gradient buffers of GPU sub-groups, first made pinned on the host", "gradients",
                   gpu_elems * 4, {"setup"}, "DeepSpeed 0.19.8 stage3.py initialize_optimizer_states: every "
                   "sub-group's buffer is made on the host and pinned, then copied to its device "
                   "(.to(subgroup_to_device[i])); the host copy is freed into the pinned cache",
                   pinned=True, blocks=[g * 4 for g in groups[:first_cpu]])
    else:
        _norm_copy(b, max(ceil_div(t.numel, G) for t in m.tensors), "one parameter's gradient partition (the "
                   "largest)", "stage3.py step: _get_norm_groups, get_grad_norm_direct over averaged_gradients")
        b.gpu("fp32 gradient of one sub-group (made at the step)", "gradients", max(groups) * 4, STEP,
              "_prepare_fp32_grad_for_sub_group, freed after each sub-group's step")
    if not s.offload_optimizer:
        _zero_optimizer(b, m, groups)
    else:
        b.gpu("Adam exp_avg + exp_avg_sq (fp32)", "optimizer_states", gpu_elems * 8, STATES,
              "torch.optim.AdamW, the backup optimizer of the GPU sub-groups, lazy at the first step")
        if first_cpu:
            _adam_temporary(b, m, max(groups[:first_cpu]), 4, "gpu", impl="foreach",
                            over=" of the backup optimizer, over one GPU sub-group",
                            source="DeepSpeed 0.19.8 stage3.py: the sub-groups kept on the GPU by offload_optimizer's "
                                   "ratio are stepped by a torch.optim.AdamW made with no foreach/fused argument, "
                                   "which torch runs as foreach on CUDA tensors (_default_to_fused_or_foreach)")
    b.host("Adam exp_avg + exp_avg_sq (fp32)", "optimizer_states", host_elems * 8, STATES,
           "DeepSpeedCPUAdam, lazy at the first step, pageable")


def fsdp1_units(m: ModelSpec) -> list[int]:
    """The elements of each FSDP1 unit of `m` as `helpers.measure.fsdp1` wraps it: the root (embedding, final norm,
    an untied head) first, then a unit per decoder layer."""
    layers = [v for k, v in m.group_params.items() if k.startswith("layer.")]
    return [m.params - sum(layers)] + layers


def _kept_gathered(b: Builder, layers: list[int], padded, compute: int) -> None:
    """FSDP1 under SHARD_GRAD_OP (reshard_after_forward False): a unit is not freed after its forward
    (`_runtime_utils.py` _post_forward_reshard frees only under the strategies that reshard after forward), so every
    decoder layer stays unsharded from its forward to its own backward, after which it is freed; the root and the
    layer being gathered (or prefetched) are counted by the items beside this. Located in dry runs (Llama-3.2-1B on 4
    ranks: the whole bf16 model unsharded at the loss)."""
    if b.setup.reshard_after_forward:
        return
    b.gpu("every other decoder layer kept unsharded after its forward (SHARD_GRAD_OP)", "temporaries",
          sum(padded(n) for n in layers[:-1]) * compute, GATHER | LOSS | BWD_START | BWD_HEAD,
          "no reshard after forward: each layer's all-gathered parameters stay until its backward has run (at the "
          "last layer's backward the one before it is counted twice: prefetching it gathers nothing)")
    b.gpu("the last decoder layer kept unsharded after its forward (SHARD_GRAD_OP)", "temporaries",
          padded(layers[-1]) * compute, LOSS, "no reshard after forward; its backward's prefetch is counted beside")


def _fsdp1_lora(b: Builder, m: ModelSpec) -> None:
    """LoRA under FSDP1 as the HF Trainer wraps a peft model (transformers `distributed/fsdp.py`
    update_fsdp_plugin_peft sets peft's `fsdp_auto_wrap_policy`): every adapter weight (a leaf Linear whose weight
    requires grad) is a unit of its own, each decoder layer's frozen weights another, the frozen embedding, norm and
    head the root; `m` is the adapters, `b.base` the whole model, whose frozen shards add_model_states placed. A frozen
    unit has no gradient: it is gathered in forward and again in backward (for its input's gradient) and resharded
    by a hook on its inputs' gradients (`_runtime_utils.py` _register_post_backward_reshard_only_hook), with no
    reduce-scatter. Under bf16-mixed the adapters stay fp32 (peft's autocast_adapter_dtype; accelerate upcasts every
    trainable FlatParameter to fp32 anyway) and MixedPrecision casts their shards to bf16 (`_mp_shard`); the bf16 base
    is not cast again. torch 2.13 `torch/distributed/fsdp/`; each moment below was located in dry runs."""
    s, G, base = b.setup, b.setup.degrees.shard, b.base
    compute, storage = dtype_bytes(s)
    off = s.offload_params
    place = b.host if off else b.gpu
    root, *layers = fsdp1_units(base)
    shard = lambda n: ceil_div(n, G)
    padded = lambda n: shard(n) * G
    layer = max(layers)
    adt = " (fp32)" if storage == 4 else " (bf16)"
    shards = [shard(t.numel) for t in m.tensors]
    place("sharded LoRA adapters" + adt + ", a unit each", "parameters", sum(shards) * storage, ALWAYS,
          "peft's wrap policy makes every adapter weight its own FlatParameter, padded to a multiple of the world "
          "size, 1/N kept" + ("; CPUOffload: on the host" if off else ""), pinned=off and s.pin_memory,
          blocks=[n * storage for n in shards])
    b.gpu("lazy initialisation: an unsharded buffer of the largest unit, made and freed", "temporaries",
          max(padded(n) for n in [root] + layers) * compute, FORWARD_INIT,
          "_init_param_attributes allocates _full_param_padded and frees it at once")
    b.gpu("unsharded root unit (embedding, norm, head; frozen)", "temporaries", padded(root) * compute,
          FORWARDS | BWD_START | BWD_HEAD | BWD_END | BWD_DONE,
          "FULL_SHARD does not reshard the root after forward; with no gradient it is resharded when backward ends")
    b.gpu("unsharded decoder layer being gathered (frozen)", "temporaries", padded(layer) * compute, GATHER,
          "one layer unit at a time in forward (no forward prefetch); its adapters are units of their own")
    b.gpu("unsharded last layer, prefetched", "temporaries", padded(layers[-1]) * compute, BWD_START | BWD_HEAD,
          "BACKWARD_PRE: the root's pre-backward hook all-gathers the next unit")
    _kept_gathered(b, layers, padded, compute)
    if not s.reshard_after_forward:
        b.gpu("every adapter unit kept unsharded after its forward (SHARD_GRAD_OP)", "temporaries",
              sum(padded(t.numel) for t in m.tensors) * compute, GATHER | LOSS | BWD_START | BWD_HEAD,
              "the adapters' units are not freed after their forward either: their all-gathered (16-bit under "
              "MixedPrecision) parameters stay until their backward")
    b.gpu("the last layer's backward: the layer before it prefetched", "temporaries", padded(layer) * compute,
          BWD_HEAD, "BACKWARD_PRE: each unit's pre-backward hook all-gathers the next before its own backward runs, "
                    "every layer's activations but the head's still saved")
    b.gpu("unsharded layer in backward and the next one prefetched (limit_all_gathers: 2 in flight)", "temporaries",
          2 * padded(layer) * compute, BWD_END, "BACKWARD_PRE prefetch; a frozen layer makes no weight gradient")
    if off:
        base_blocks = [shard(n) * compute for n in [root] + layers]
        every = base_blocks + [n * storage for n in shards]
        b.host("pageable shards until the first reshard (pin_memory() made the pinned copy)", "parameters",
               sum(every), FORWARD_INIT, "_init_param_attributes: _local_shard = _local_shard.pin_memory(); the flat "
               "parameter still holds the pageable one until it is first resharded")
        b.host("sharded gradient buffers on the host (_cpu_grad), frozen units' too", "gradients", sum(every),
               FROM_FORWARD_INIT,
               "_init_param_attributes makes a pinned zeros_like(_local_shard) for every FlatParameter with "
               "CPUOffload, whether it requires grad or not: the frozen base's as large as its shards; the "
               "adapters' reduce-scattered gradients are copied into theirs", pinned=s.pin_memory, blocks=every)
    else:
        b.gpu("sharded gradients of the adapters" + adt, "gradients", sum(shards) * storage, GRADS,
              "each adapter unit's flat gradient reduce-scattered, cast to the parameters' dtype "
              "(_cast_grad_to_param_dtype)", blocks=[n * storage for n in shards])
    place("AdamW exp_avg + exp_avg_sq of the adapters (sharded)", "optimizer_states", 2 * sum(shards) * storage,
          STATES, "torch AdamW on the adapters' flat shards; the frozen base has none"
          + ("; the step runs on the CPU" if off else ""))
    _adam_temporary(b, m, sum(shards), storage, "host" if off else "gpu")


def _fsdp1(b: Builder, m: ModelSpec) -> None:
    """FSDP1 (FullyShardedDataParallel, FULL_SHARD) as `helpers.measure.fsdp1` wraps a decoder: a unit per decoder
    layer and the root unit (embedding, final norm, output head), each one FlatParameter padded to a multiple of the
    world size. Sources: torch 2.13 `torch/distributed/fsdp/_flat_param.py` (`_init_param_attributes`: `_mp_shard`,
    `_full_param_padded`, `_full_prec_full_param_padded`, `_cpu_grad`), `_runtime_utils.py` (`_post_forward_reshard`
    keeps the root unsharded, BACKWARD_PRE prefetch, `_reduce_grad`, `_cast_grad_to_param_dtype`). Each moment below
    was located in dry runs."""
    if b.base is not None:
        return _fsdp1_lora(b, m)
    s, G = b.setup, b.setup.degrees.shard
    compute, storage = dtype_bytes(s)
    off = s.offload_params
    mp = s.precision == "bf16-mixed"
    place = b.host if off else b.gpu
    gp = m.group_params
    units = fsdp1_units(m)
    root, *layers = units                                      # root: embedding, final norm, an untied head
    shard = lambda n: ceil_div(n, G)
    padded = lambda n: shard(n) * G
    layer = max(layers)
    dt = " (fp32)" if storage == 4 else " (bf16)"
    shards = sum(shard(n) for n in units)
    place("sharded flat parameters" + dt, "parameters", shards * storage, ALWAYS,
          "each unit's FlatParameter padded to a multiple of the world size, 1/N kept (_local_shard)"
          + ("; CPUOffload: on the host, pinned by FSDP1 itself" if off else ""), pinned=off and s.pin_memory,
          blocks=[shard(n) * storage for n in units])
    b.gpu("lazy initialisation: an unsharded buffer of the largest unit, made and freed", "temporaries",
          max(padded(n) for n in units) * storage, FORWARD_INIT,
          "_init_param_attributes allocates _full_param_padded" + (" and the fp32 _full_prec_full_param_padded"
                                                                   if mp else "") + " and frees it at once")
    b.gpu("unsharded root unit (embedding, norm, head)", "temporaries", padded(root) * compute,
          FORWARDS | BWD_START | BWD_HEAD | BWD_END | BWD_DONE,
          "FULL_SHARD does not reshard the root after forward: it stays unsharded until its own backward")
    b.gpu("unsharded decoder layer being gathered" + (" and its bf16 shard (_mp_shard)" if mp else ""), "temporaries",
          padded(layer) * compute + (shard(layer) * compute if mp else 0), GATHER,
          "one layer unit at a time in forward (no forward prefetch)")
    b.gpu("unsharded last layer, prefetched", "temporaries", padded(layers[-1]) * compute, BWD_START | BWD_HEAD,
          "BACKWARD_PRE: the root's pre-backward hook (on the loss, so before the loss's own backward) all-gathers "
          "the next unit")
    _kept_gathered(b, layers, padded, compute)
    head = gp["embed"] if m.tied else m.lm_head_params
    b.gpu("output head's weight gradient, held until the root's flat gradient is assembled", "temporaries",
          head * compute, BWD_HEAD | BWD_END | BWD_DONE,
          "the root's parameters are views of one split of its FlatParameter: the split's backward runs once every "
          "view's gradient is there, i.e. after the embedding's backward, the last")
    b.gpu("the last layer's backward: the next layer prefetched, the weight gradients and their flat concatenation",
          "temporaries", padded(layer) * compute + 2 * layers[-1] * compute, BWD_HEAD,
          "the backward of the last layer follows the head's at once, with all but one layer's activations saved "
          "(counted here with all of them: at most one layer's activations too many)")
    b.gpu("unsharded layer in backward and the next one prefetched (limit_all_gathers: 2 in flight)", "temporaries",
          2 * padded(layer) * compute, BWD_END, "BACKWARD_PRE prefetch")
    b.gpu("a layer's weight gradients and the flat gradient concatenated from them", "temporaries",
          2 * layer * compute, BWD_END, "the split's backward concatenates every view's gradient into the unit's "
          "unsharded flat gradient, which _reduce_grad then reduce-scatters (its 1/N output is smaller)")
    embed = gp["embed"]
    if m.tied:
        b.gpu("the embedding's own weight gradient and its sum with the head's", "temporaries", 2 * embed * compute,
              BWD_DONE, "a tied weight's two gradients are added (out of place) before the split's backward")
    else:
        b.gpu("the embedding's weight gradient and the root's flat gradient assembled from every view's", "temporaries",
              (embed + root) * compute, BWD_DONE, "the split's backward concatenates the views' gradients")
    if off:
        pin = s.pin_memory
        b.host("pageable shards until the first reshard (pin_memory() made the pinned copy)", "parameters",
               shards * storage, FORWARD_INIT, "_init_param_attributes: _local_shard = _local_shard.pin_memory(); the "
               "flat parameter still holds the pageable one until it is first resharded")
        b.host("sharded gradients on the host (_cpu_grad)" + dt, "gradients", shards * storage, FROM_FORWARD_INIT,
               "made (zeros, pinned) at the lazy initialisation and kept: each reduce-scattered gradient is copied in",
               pinned=pin, blocks=[shard(n) * storage for n in units])
    else:
        b.gpu("sharded gradients" + dt + " of the layers", "gradients", sum(shard(n) for n in layers) * storage, GRADS,
              "reduce-scattered, cast to the parameters' dtype (_cast_grad_to_param_dtype)")
        # with accumulation, every sharded gradient (the root's too) is kept between micro batches and added into
        # (_accumulate_sharded_grad), so it is alive through the later micro batches' forward and backward
        later = FWD_BWD | BWD_DONE if s.grad_accum > 1 and s.sync_each_batch else frozenset()
        b.gpu("sharded gradient of the root unit", "gradients", shard(root) * storage, STEP_NORM | STEP | later,
              "its unit reduces last, after its unsharded buffers are freed")
    place("AdamW exp_avg + exp_avg_sq (sharded)", "optimizer_states", 2 * shards * storage, STATES,
          "torch AdamW on the flat shards" + ("; the step runs on the CPU" if off else ""))
    _adam_temporary(b, m, shards, storage, "host" if off else "gpu")


MODEL_STATES = {"replicated": _torch_replicated, "fsdp2": _fsdp2, "fsdp1": _fsdp1, "zero12": _zero12, "zero3": _zero3}
"""The memory items of each strategy's `states` key (helpers.strategies)."""
