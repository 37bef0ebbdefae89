"""GRPO's generation between steps (`run` 'grpo'): what generates the completions, beside what outlives a step.

Read in TRL 1.10 (huggingface/trl at f2cd577: trl/trainer/grpo_trainer.py `_generate_single_turn`,
trl/generation/vllm_generation.py, trl/models/utils.py `unwrap_model_for_generation`), vLLM's worker
(vllm/v1/worker/gpu_worker.py) and transformers 5.23 (`generate`, cache_utils.py DynamicLayer):

- **When.** Each generation runs after an optimizer step (and zero_grad) and before the next step's forward: the
  parameters, optimizer states and engine buffers that outlive a step are alive (the items alive at every moment
  between two steps, as `helpers.estimate.saving` takes them), no gradients, no activations.
- **vLLM colocated** (`generation` 'vllm-colocate', TRL `vllm_mode="colocate"`): an `LLM` in each training process,
  built with `gpu_memory_utilization` (`vllm_share`). vLLM's worker takes `requested_memory = total_memory x
  gpu_memory_utilization` (and refuses to start when less is free) and fills it with its weights, its peak
  activations and what it allocates outside torch (CUDA graphs, NCCL), giving the rest to the KV cache
  (`determine_available_memory`: requested_memory - non_kv_cache_memory). Counted in full: an upper bound by the
  profiled activation peak, which returns to the (shared) caching allocator after profiling. It needs the GPU's
  total memory (`gpu_gib`). Without sleep mode it holds that share at every moment from set-up on; with
  `vllm_enable_sleep_mode` (`vllm_sleep`) TRL puts it to sleep at level 2 after every generation
  (`CuMemAllocator` releases its weights and KV cache pools) and wakes it for the next: the share is counted at the
  generation alone. What a sleeping engine keeps (buffers outside its pools) is not counted.
- **Weights to vLLM** (`sync_weights`, both vLLM modes): with a PEFT model under ZeRO-3, `gather_params(list(
  model.parameters()))` gathers the whole model at once to merge the adapters (16-bit, on every GPU); otherwise one
  parameter (or FSDP1 module) at a time.
- **The reference's sync** (`sync_ref`, TRL's `sync_ref_model`; callbacks.py SyncRefModelCallback, after a step):
  in place, except under ZeRO-3, where the policy and the reference are gathered whole together; its own moment
  in the generation phase, before the generation's buffers exist.
- **transformers' generate** (`generation` 'generate', TRL's default `use_vllm=False`): each process generates its
  share of the generation batch at once, `per_device_train_batch_size x steps_per_generation` sequences
  (`steps_per_generation` defaults to `gradient_accumulation_steps`: grad_accum here). Its KV cache reaches the
  whole sequence (prompt + completion) for every layer, keys and values in the compute dtype (accelerate's autocast
  wraps the model's forward), and `DynamicLayer.update` extends one layer's cache by `torch.cat` (old and new at
  once). Each token's last logits are copied to fp32 and turned into sampling probabilities. Under ZeRO-3
  `ds3_gather_for_generation` (True by default) gathers the whole model for the generation.

Left out: the no_grad forwards that score the completions (the old policy's and the reference's log-probs, one
micro batch at a time after generation) hold less than the step's forward; sliding-window layers' shorter caches and
MLA's compressed one are counted at full width (an upper bound); vLLM's own host memory.
"""

from __future__ import annotations

from helpers.estimate.items import ALWAYS, BETWEEN_STEPS, GENERATE, SCORE, SYNC_REFERENCE, Item
from helpers.estimate.saving import PERSISTENT
from helpers.estimate.states import Builder
from helpers.models import ModelSpec
from helpers.units import GiB, fmt

TRL = "TRL 1.10 grpo_trainer.py _generate_single_turn, generation/vllm_generation.py"
VLLM = "vLLM v1 gpu_worker.py init_device (requested_memory), determine_available_memory"
SLEEPING = ("master_weights", "optimizer_states")      # offload_states' hp_params, optim_states (ZeRO-1/2 and 3)
SLEEPING_ZERO3 = ("gradients", "comm_buffers")          # ZeRO-3's lp_grads (copied) and contiguous_grad_buffer (freed)
SLEEP = ("OpenRLHF 3c3be623 utils/deepspeed/deepspeed_utils.py offload_deepspeed_states (optim_states, "
         "contiguous_grad_buffer, hp_params, lp_grads; lp_params kept), trainer/ppo_trainer.py ppo_train")
SCORE_SOURCE = ("OpenRLHF 3c3be623 trainer/ppo_utils/experience_maker.py make_experience, _dispatch_forward; "
                "models/actor.py Actor.forward")
OPENRLHF = ("OpenRLHF 3c3be623 cli/train_ppo_ray.py (--train.colocate_all: the engines in the actor's placement "
            "group), trainer/ray/vllm_engine.py create_vllm_engines, trainer/ppo_utils/samples_generator.py (sleep "
            "and wake_up around generation)")


def sequences(setup) -> int:
    """Sequences one process generates at once with transformers' generate: per_device_train_batch_size x
    steps_per_generation (TRL's default: gradient_accumulation_steps)."""
    return setup.batch * (setup.steps_per_generation or setup.grad_accum)


def vllm_short(setup, m: ModelSpec) -> dict | None:
    """Where a colocated vLLM's share cannot hold its worker's 16-bit weights (1/vllm_tp of the model; the whole
    model at TRL's default vllm_tensor_parallel_size 1): {'share', 'weights'} in bytes; vLLM then has no memory left for
    its KV cache and refuses to start (gpu_worker.py: available KV cache memory = requested_memory -
    non_kv_cache_memory). None where it can, or where no capacity is given."""
    share = share_bytes(setup) if setup.run == "grpo" and setup.generation == "vllm-colocate" else None
    weights = m.params * 2 // setup.vllm_tp
    return {"share": share, "weights": weights} if share is not None and share <= weights else None


def share_bytes(setup) -> int | None:
    """vLLM's budget on each GPU in bytes (vllm_share x the GPU's total memory); None without a capacity."""
    return None if setup.gpu_gib is None else int(setup.vllm_share * setup.gpu_gib * GiB)


def add_generation(b: Builder, m: ModelSpec) -> None:
    """The generation moment: what outlives a step, and the generation engine's own buffers."""
    s = b.setup
    asleep = s.engine_sleep and not s.offload_optimizer
    sleeping = SLEEPING + (SLEEPING_ZERO3 if s.strat.family == "zero3" else ())
    moved = 0
    for n, i in enumerate(b.items):     # alive between two steps (gradients: zero_grad after the step frees them)
        if asleep and i.device == "gpu" and i.category in sleeping and PERSISTENT <= i.moments:
            moved += i.nbytes if i.category != "comm_buffers" else 0      # (the ipg bucket is freed, not copied)
            b.items[n] = Item(i.name, i.category, i.device, i.nbytes, i.moments - BETWEEN_STEPS, i.why, i.blocks)
        elif PERSISTENT <= i.moments and i.category != "gradients":
            b.items[n] = Item(i.name, i.category, i.device, i.nbytes, i.moments | BETWEEN_STEPS, i.why, i.blocks)
    if moved:
        b.host("the actor's states offloaded while it sleeps (--ds.enable_sleep)", "optimizer_states", moved,
               BETWEEN_STEPS, f"offload_deepspeed_states moves the optimizer states and fp32 master weights"
                              f"{' and the gradient partition' if s.strat.family == 'zero3' else ''}, {fmt(moved)} "
                              f"per rank, to pinned host memory after each fit and reloads them before the next; the "
                              f"16-bit parameters stay ({SLEEP}; DeepSpeed 0.19.8 offload_states)", pinned=True)
    compute = 4 if s.precision == "fp32" else 2
    zero3 = s.strat.family == "zero3"
    if s.generation == "generate":
        _generate(b, m, compute, zero3)
    else:
        _vllm(b, m, zero3)
    if s.dpo_logps == "openrlhf":
        _score(b, m, compute)
    if s.sync_ref and zero3:
        both = 2 * m.params * 2
        b.gpu("the policy and the reference gathered whole to mix them (sync_ref_model)", "generation", both,
              SYNC_REFERENCE, f"TRL 1.10 callbacks.py SyncRefModelCallback.sync_target_model under ZeRO-3: "
                              f"GatheredParameters(policy + reference), 2 x {m.params:,} x 2 B = {fmt(both)} on every "
                              f"GPU after the step (every ref_model_sync_steps)")


def _vllm(b: Builder, m: ModelSpec, zero3: bool) -> None:
    s = b.setup
    if s.generation == "vllm-colocate":
        share = share_bytes(s)
        if share:
            b.gpu(f"vLLM engine ({s.vllm_share:g} of the GPU's memory: weights, KV cache, CUDA graphs)",
                  "generation", share, GENERATE if s.vllm_sleep else ALWAYS,
                  f"gpu_memory_utilization {s.vllm_share:g} x {s.gpu_gib:g} GiB: vLLM takes requested_memory = "
                  f"total x utilization and fills it with its weights, profiled activations, non-torch memory and the "
                  f"KV cache ({VLLM}); " + (f"asleep (level {1 if s.dpo_logps == 'openrlhf' else 2}) outside "
                                            f"generation: counted while generating"
                                            if s.vllm_sleep else "held through the training step (no sleep mode)")
                  + f" ({OPENRLHF if s.dpo_logps == 'openrlhf' else TRL})")
        if s.vllm_sleep and s.dpo_logps == "openrlhf":
            weights = m.params * 2 // s.vllm_tp
            b.host("vLLM's weights kept on the host while it sleeps (level 1)", "generation", weights,
                   ALWAYS - GENERATE, f"OpenRLHF sleeps its engines at level 1 (vllm_engine.py sleep(level=1), "
                                      f"right after creating them and after each generation): vLLM's CuMemAllocator "
                                      f"copies each worker's weights, {m.params:,} x 2 B / tensor_parallel_size "
                                      f"{s.vllm_tp} = {fmt(weights)}, to pinned host memory and frees the KV cache "
                                      f"({OPENRLHF})", pinned=True)
    if zero3 and s.lora_rank is not None and s.dpo_logps != "openrlhf":   # (TRL's sync_weights)
        whole = m.params * 2
        b.gpu("the whole model gathered to merge the adapters for vLLM", "generation", whole, GENERATE,
              f"sync_weights: a PEFT model under ZeRO-3 gathers every parameter at once (gather_params(list("
              f"model.parameters()))), {m.params:,} x 2 B = {fmt(whole)}, merges the adapters and pushes the weights "
              f"({TRL})")


def _score(b: Builder, m: ModelSpec, compute: int) -> None:
    """OpenRLHF's make_experience: after generation (vLLM asleep, or still holding its share) the actor's no-grad
    forward over `score_batch` sequences makes the whole sequence's logits and their fp32 copy at once; the
    reference's forward (another process) comes after the actor's cache is emptied (colocated: `_dispatch_forward`
    syncs and calls empty_cache), the same size. A layer's own working set under no_grad is below the logits and
    not counted."""
    s = b.setup
    n = s.score_batch or s.batch
    E = n * s.seq * m.vocab
    b.gpu(f"scoring forward's logits and their fp32 copy ({n} sequences, no grad)", "logits", (compute + 4) * E,
          SCORE, f"make_experience: Actor.forward over {n} x {s.seq} tokens returns {E:,} logits, copied to fp32 "
                 f"(`.to(torch.float32)`) while the {compute}-byte ones are alive, then scored ({SCORE_SOURCE})")


def _generate(b: Builder, m: ModelSpec, compute: int, zero3: bool) -> None:
    s = b.setup
    n = sequences(s)
    per_token = m.layers * (m.k_width + m.v_width) * compute
    cache = n * s.seq * per_token
    layer = cache // m.layers
    b.gpu(f"KV cache of generate ({n} sequences x {s.seq} tokens)", "generation", cache + layer, GENERATE,
          f"transformers' generate over {s.batch} x {n // s.batch} sequences (per_device_train_batch_size x "
          f"steps_per_generation), keys and values of {m.layers} layers x ({m.k_width} + {m.v_width}) features x "
          f"{compute} B per token up to the whole sequence: {fmt(cache)}, and one layer's cache being extended by "
          f"torch.cat, {fmt(layer)} (transformers 5.23 cache_utils.py DynamicLayer.update; {TRL})")
    scores = n * m.vocab * (compute + 4 + 4)
    b.gpu("the last position's logits, their fp32 copy and the sampling probabilities", "generation", scores,
          GENERATE, f"{n} x vocab x ({compute} + 4 + 4) B per new token (transformers 5.23 generation/utils.py "
                    f"_sample: next_token_logits in fp32, softmax, multinomial)")
    if zero3:
        whole = m.params * 2
        b.gpu("the whole model gathered for generation (ds3_gather_for_generation)", "generation", whole, GENERATE,
              f"unwrap_model_for_generation(gather_deepspeed3_params=True, TRL's default): every parameter gathered "
              f"at once, {m.params:,} x 2 B = {fmt(whole)} (TRL 1.10 models/utils.py; {TRL})")


def words(setup) -> str | None:
    """What generates the completions, in a clause; None for runs that generate nothing."""
    if setup.run != "grpo":
        return None
    if setup.generation == "generate":
        return (f"transformers' generate in each process: {sequences(setup)} sequences x {setup.seq} tokens of KV "
                f"cache between steps" + (", the whole model gathered (ds3_gather_for_generation)"
                                          if setup.strat.family == "zero3" else ""))
    if setup.generation == "vllm-server":
        if setup.dpo_logps == "openrlhf":
            return "vLLM engines on GPUs of their own (the actor's GPUs send them the weights)"
        return "a vLLM server on GPUs of its own (the training GPUs send it the weights)"
    share = share_bytes(setup)
    held = "while generating only (sleep mode)" if setup.vllm_sleep else "through the training step too"
    if share is None:
        return (f"vLLM colocated with {setup.vllm_share:g} of each GPU's memory, not counted: no GPU capacity "
                f"given (--gpu or --gpu-gib)")
    return f"vLLM colocated: {fmt(share)} per GPU ({setup.vllm_share:g} of {setup.gpu_gib:g} GiB), {held}"
