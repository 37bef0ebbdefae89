"""Saving a checkpoint: what each rank holds while the HF Trainer saves the model and the optimizer (the `save` moment,
right after an optimizer step, counted in the step phase: a phase's figure is its highest moment).

Read from the installed transformers 5.23 (trainer.py `_save_checkpoint`: `save_model`, then
`_save_optimizer_and_scheduler`), accelerate 1.15, DeepSpeed 0.19.8, torch 2.13 and safetensors 0.8, and measured on
the real DeepSpeed engine by `helpers.measure.saving` (data/results/checkpoint_save.json). Two mechanisms decide
every rule:
- `torch.save` of GPU tensors copies one whole *storage* to the host at a time (torch/serialization.py `_save`:
  `storage = storage.cpu()`, rebound per storage): the host holds the largest storage written, and a tensor that is
  a view saves its whole storage. safetensors' `save_file` moves every tensor of the dict to the host first
  (safetensors/torch.py `_flatten_as_ptr` keeps each copy alive): the whole file at once.
- Optimizer `state_dict()`s return references, never copies (torch optim/optimizer.py; DeepSpeed
  stage_1_and_2.py / stage3.py `state_dict`): a host copy is made only by what writes them.

The rules, per engine (P parameters, N data-parallel ranks, G ranks per node; host figures per node):
- **DeepSpeed ZeRO-1/2.** `save_model` calls accelerate's `get_state_dict`, which clones the whole model's state
  dict to the host (`clone_tensors_for_torch_save`) on every rank, although only rank 0 writes it (a LoRA run too:
  the base is cloned): G x the model's bytes. Then `engine.save_checkpoint`: rank 0 writes the model file, one copy of
  the whole 16-bit flat buffer the parameters are views of; every rank writes its optimizer shard, one fp32 storage
  at a time (4 P/N bytes, the partition, exp_avg and exp_avg_sq each their own). Offloaded states are on the host
  already: written without a copy.
- **DeepSpeed ZeRO-3.** With `stage3_gather_16bit_weights_on_model_save` (`save_16bit`, true in LLaMA-Factory's,
  TRL's and accelerate's ZeRO-3 examples) `_zero3_consolidated_16bit_state_dict` gathers each leaf module's own
  parameters on the GPU (the largest module at full size) and copies them to rank 0's host, where the whole 16-bit
  model accumulates (a LoRA run: the adapters alone, `exclude_frozen_parameters`). Then `save_checkpoint`: each rank
  writes its optimizer sub-groups one storage at a time (4 x the largest sub-group's elements).
- **FSDP (1 and 2), full state dict** (the Trainer's default `state_dict_type` FULL_STATE_DICT, training_args.py):
  `get_model_state_dict(full_state_dict=True, cpu_offload=True)` gathers one parameter at a time on the GPU and
  keeps the whole model on rank 0's host, in the trained dtype; then the full optimizer state (exp_avg and
  exp_avg_sq of every trained parameter, fp32) on rank 0's host: the larger of the two. **Sharded**
  (SHARDED_STATE_DICT, `sharded_save`, and torchtitan's synchronous saves): torch.distributed.checkpoint's writer
  copies each rank's tensors to the host one at a time, the next loaded before the last is written
  (filesystem.py `_OverlappingCpuLoader`): two of the largest, the widest parameter's fp32 optimizer states at
  4 x ceil(P_widest / N) bytes each, in pinned memory (a non-blocking device-to-host copy), rounded up to a power of
  two and kept cached after the save. Read, not measured: on this CPU the writer takes its serial loader. An
  asynchronous save (torchtitan's async modes) stages the whole state dict first: not modelled, listed by the reader.
- **One GPU or DDP** (no engine): rank 0's `save_pretrained` writes safetensors shards of up to 50 GB
  (`max_shard_size="50GB"`), each whole on the host; then `torch.save(optimizer.state_dict())`, one state tensor at
  a time. A LoRA run saves its adapters alone (peft `get_peft_model_state_dict`).
Left out: the page cache of the files written; transformers releases before the PEFT-under-ZeRO-3 special case (they
gathered the whole model); a Trainer-less DeepSpeed `save_checkpoint` on a model with frozen parameters (it copies
every frozen parameter, not measured); MoE checkpoints' per-expert files.
"""

from __future__ import annotations

from helpers.estimate.adapters import trained_params
from helpers.estimate.items import Item
from helpers.estimate.states import Builder
from helpers.models import ModelSpec
from helpers.units import fmt

SAVE_MODEL = frozenset({"save_model"})          # Trainer.save_model: the model's state dict written
SAVE_STATES = frozenset({"save_states"})        # then _save_optimizer_and_scheduler: the optimizer's state
SAVE = SAVE_MODEL | SAVE_STATES
PERSISTENT = frozenset({"step", "steady_forward_start", "steady_backward_done"})
"""An item alive at all of these outlives the step: it is there while the checkpoint is saved."""
SHARD_BYTES = 50 * 10**9      # transformers 5.23 PreTrainedModel.save_pretrained: max_shard_size="50GB" (decimal)
SOURCE = ("transformers 5.23 trainer.py _save_checkpoint; accelerate 1.15 Accelerator.get_state_dict; DeepSpeed 0.19.8 "
          "engine.py save_checkpoint, _zero3_consolidated_16bit_state_dict; torch 2.13 serialization.py _save")


def model_bytes(b: Builder) -> int:
    """The model's state dict in the bytes each parameter is kept in, whole (unsharded): the parameters items alive
    at the step, on the GPU or offloaded to the host (a host item is per node: divided by its ranks), times the
    shards they were split into."""
    s = b.setup
    at_step = [i for i in b.items if i.category == "parameters" and "step" in i.moments]
    per_gpu = sum(i.nbytes for i in at_step if i.device == "gpu") + \
        sum(i.nbytes for i in at_step if i.device == "host") // s.ranks_per_node
    return per_gpu * (s.degrees.shard if "parameters" in s.strat.shards else 1)


def largest_module(m: ModelSpec) -> int:
    """Elements of the largest leaf module's own parameters: `_zero3_consolidated_16bit_state_dict` gathers
    `module.parameters(recurse=False)` together, so an MoE's fused experts (gate_up_proj and down_proj of one
    module) are on the GPU at full size at once, not one tensor at a time."""
    sizes: dict[str, int] = {}
    for t in m.tensors:
        owner = t.name.rsplit(".", 1)[0]
        sizes[owner] = sizes.get(owner, 0) + t.numel
    return max(sizes.values())


def largest_sub_group(m: ModelSpec, s, n_dp: int) -> int:
    """Elements of the largest ZeRO-3 optimizer sub-group of one rank: the trained parameters' partitions (weights
    with weight decay, the Trainer's larger parameter group; a LoRA run's adapters as one group) taken in order, a
    group closed once it reaches sub_group_size (DeepSpeed 0.19.8 stage3.py _create_fp16_sub_groups)."""
    if s.lora_rank:
        return min(-(-trained_params(m, s) // n_dp), s.sub_group_size)     # small: at most the whole adapter partition
    best = run = 0
    for t in m.tensors:
        if t.ndim < 2:
            continue
        run += -(-t.numel // n_dp)
        if run >= s.sub_group_size:
            best, run = max(best, run), 0
    return max(best, run)


STAGED_WHY = ("torch.distributed.checkpoint's FileSystemWriter (thread_count 1; on a GPU its _OverlappingCpuLoader) "
              "copies the rank's tensors to the host one at a time, smallest first, with non_blocking=True, which "
              "lands in pinned memory, and loads the next before yielding the last to be written (values(): _drain, "
              "_refill, yield; inflight_threshhold 1 MB): the two largest, the fp32 optimizer states of the widest "
              "parameter's shard, at once; the pinned caching allocator rounds each block up to a power of two and "
              "keeps it after the save (torch 2.13 distributed/checkpoint/filesystem.py; read, not measured: a CPU "
              "run takes the serial loader, which copies nothing)")


def _gathered(nbytes: int, rank: ModelSpec, whole: ModelSpec) -> int:
    """A tensor-parallel rank's bytes of the model (or of its optimizer states) scaled to the whole model's, which a
    full state dict gathers from every rank (torch 2.13 distributed/_state_dict_utils.py `_gather_state_dict`: a
    DTensor is gathered over its whole device mesh, the tensor-parallel dimension with the data-parallel one).
    Exact where every parameter is kept in one dtype, as with tensor parallelism here (LoRA, whose adapters keep
    another dtype, is refused with it)."""
    return nbytes * whole.params // rank.params


def _node(b: Builder, name: str, nbytes: int, moments, why: str) -> None:
    """A host item of the node that holds it (rank 0's, where one rank writes), its bytes already per node."""
    if nbytes > 0:
        b.items.append(Item(name, "checkpoint", "host", int(nbytes), frozenset(moments), why))


def add_save(b: Builder, m: ModelSpec, whole: ModelSpec | None = None) -> None:
    """The save moments: what outlives the step, and the engine's save transients on the host and the GPU. `m` is
    what one rank holds (a tensor-parallel rank's share); `whole` the whole model, which a full (unsharded) save
    gathers from every tensor-parallel rank."""
    s = b.setup
    whole = whole or m
    for n, i in enumerate(b.items):                               # what is alive between two steps
        if PERSISTENT <= i.moments:
            b.items[n] = Item(i.name, i.category, i.device, i.nbytes, i.moments | SAVE, i.why, i.blocks)
    trained = trained_params(m, s)
    n_dp = s.degrees.shard if "optimizer_states" in s.strat.shards else 1
    g = s.ranks_per_node
    fam = s.strat.family
    model = model_bytes(b)
    widest = max(t.numel for t in m.tensors)
    each = f" (x{g} ranks)" if g > 1 else ""
    if fam == "zero12":
        opt = 0 if s.offload_optimizer else -(-trained // n_dp) * 4
        tied = m.tensors[0].numel * (4 if s.precision == "fp32" or s.base_fp32 else 2) if m.tied else 0
        _node(b, f"state dict cloned to the host for save_model{each}", g * (model + tied), SAVE_MODEL,
              f"Trainer.save_model -> accelerate get_state_dict -> clone_tensors_for_torch_save: the whole model "
              f"({fmt(model)}) on every rank's host, though rank 0 alone writes it"
              + (f", the tied embedding cloned twice (once per state-dict key, {fmt(tied)})" if tied else "")
              + f" ({SOURCE})")
        _node(b, "checkpoint files written (rank 0's model file, each rank's optimizer shard)",
              max(model, opt) + (g - 1) * opt, SAVE_STATES,
              f"engine.save_checkpoint: torch.save copies one storage at a time, on rank 0 the whole 16-bit flat "
              f"buffer the parameters are views of ({fmt(model)}), on every rank its fp32 optimizer storages ("
              + (f"{fmt(opt)} each" if opt else "offloaded: on the host already, written without a copy") + ")")
    elif fam == "zero3":
        if s.save_16bit:
            size = 4 if s.precision == "fp32" else 2          # the parameters' own dtype (fp32 without bf16/fp16)
            whole = trained * (4 if s.adapters_fp32 else 2) if s.lora_rank else m.params * size
            _node(b, f"{'16-bit' if size == 2 else 'fp32'} model gathered on rank 0 "
                     f"(stage3_gather_16bit_weights_on_model_save)", whole, SAVE_MODEL,
                  f"_zero3_consolidated_16bit_state_dict: each module's parameters gathered and copied to rank 0's "
                  f"host, the whole {'adapters (exclude_frozen_parameters)' if s.lora_rank else 'model'} "
                  f"accumulating ({SOURCE})")
            b.gpu("the largest module's parameters gathered for the save", "temporaries", largest_module(m) * size,
                  SAVE_MODEL, f"the largest leaf module's own parameters at full size ({size} B each), gathered "
                              f"together, copied, re-partitioned ({SOURCE})")
        opt = 0 if s.offload_optimizer else 4 * largest_sub_group(m, s, n_dp)
        _node(b, f"optimizer sub-group written{each}", g * opt, SAVE_STATES if s.save_16bit else SAVE,
              f"engine.save_checkpoint: torch.save copies one fp32 sub-group storage at a time, 4 B x the largest "
              f"sub-group's elements per rank (parameters' partitions taken in order until they reach "
              f"sub_group_size: stage3.py _create_fp16_sub_groups; {SOURCE})")
    elif fam in ("fsdp1", "fsdp2"):
        opt = trained * 8
        if s.sharded_save:
            tensor = 4 * -(-widest // s.degrees.shard)          # the widest parameter's fp32 state, one shard
            name = ("two largest tensors (the widest parameter's fp32 optimizer states) staged in pinned memory for "
                    f"the sharded save{each}")
            b.items.append(Item(name, "checkpoint", "host", g * 2 * tensor, SAVE, STAGED_WHY, blocks=(tensor,) * (2 * g)))
        else:
            per = model // m.params or 2        # bytes per parameter as trained
            if whole is not m:                  # the tensor-parallel shards gathered too
                model, opt, widest = _gathered(model, m, whole), _gathered(opt, m, whole), max(t.numel for t in whole.tensors)
            _node(b, "full model state dict on rank 0 (FULL_STATE_DICT)", model, SAVE_MODEL,
                  f"get_model_state_dict(full_state_dict=True, cpu_offload=True): the whole model in the trained "
                  f"dtype on rank 0's host (torch 2.13 distributed/checkpoint/state_dict.py; {SOURCE})")
            _node(b, "full optimizer state dict on rank 0 (FULL_STATE_DICT)", opt, SAVE_STATES,
                  "get_optimizer_state_dict(full_state_dict=True, cpu_offload=True): exp_avg and exp_avg_sq of every "
                  "trained parameter (fp32) on rank 0's host (accelerate 1.15 save_fsdp_optimizer)")
            b.gpu("one parameter gathered for the full state dict", "temporaries", widest * per,
                  SAVE, "get_model_state_dict gathers one parameter at a time at full size before its copy")
    else:
        if whole is not m:
            model, trained, widest = _gathered(model, m, whole), whole.params, max(t.numel for t in whole.tensors)
        written = trained * (4 if s.adapters_fp32 else 2) if s.lora_rank else min(model, SHARD_BYTES)
        _node(b, "model written by save_pretrained (rank 0)", written, SAVE_MODEL,
              f"safetensors save_file copies a whole shard to the host (max_shard_size 50 GB)"
              f"{': the adapters alone (peft)' if s.lora_rank else ''} ({SOURCE})")
        largest = 4 * trained if s.lora_rank else 4 * widest
        _node(b, "optimizer state written by torch.save (rank 0)", largest, SAVE_STATES,
              "torch.save(optimizer.state_dict()) copies one state tensor at a time: the largest, fp32"
              + (" (with LoRA counted as every adapter's: a bound, a few MiB)" if s.lora_rank else ""))
