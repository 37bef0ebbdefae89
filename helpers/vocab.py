"""The one vocabulary of memory categories, phases and devices shared by estimates, measurements and plots."""

from enum import StrEnum


class Category(StrEnum):
    """Where a byte goes. Members are their strings ('parameters' == Category.parameters): JSON and plots unchanged."""

    parameters = "parameters"              # the weights the forward pass reads (compute copy; fp32 when also master)
    master_weights = "master_weights"      # an fp32 copy kept beside low-precision parameters, updated by the optimizer
    gradients = "gradients"                # gradients, including an engine's fp32 gradient partition
    optimizer_states = "optimizer_states"  # AdamW exp_avg and exp_avg_sq
    activations = "activations"            # tensors saved by autograd for backward (and a recomputed layer)
    logits = "logits"                      # logits, the loss's fp32 upcast, log-softmax output and their gradients
    temporaries = "temporaries"            # short-lived full-size buffers: foreach AdamW temporaries, gathered layers
    comm_buffers = "comm_buffers"          # gradient buckets of DDP and DeepSpeed, reduce-scatter buffers
    checkpoint = "checkpoint"              # optimizer and master states loaded from disk while resuming
    pinned_overhead = "pinned_overhead"    # bytes the pinned host caching allocator adds by rounding each block up
    generation = "generation"              # a generation engine's share between steps: vLLM's budget, a KV cache


class Phase(StrEnum):
    """When in a run: each phase's figure is its highest moment."""

    setup = "setup"        # model and engine built, before the first forward
    resume = "resume"      # loading a checkpoint's optimizer states beside the live buffers (only when resuming)
    forward = "forward"    # end of the first forward pass (loss computed)
    backward = "backward"  # the first backward pass, at its highest point
    step = "step"          # the first optimizer step: where AdamW's states are created
    generation = "generation"  # between two steps: completions generated (GRPO), beside what outlives a step
    steady = "steady"      # forward + backward of every later iteration, with optimizer states alive


CATEGORIES = tuple(c.value for c in Category)
PHASES = tuple(p.value for p in Phase)

DEVICES = ("gpu", "host")

CATEGORY_MEANING = {
    "parameters": "the weights the forward pass reads (fp32 when they are also what the optimizer updates)",
    "master_weights": "an fp32 copy beside low-precision weights, the one the optimizer updates",
    "gradients": "one value per weight, made by backward; engines add partitions and fp32 copies",
    "optimizer_states": "AdamW's exp_avg and exp_avg_sq, two per weight, made at the first step",
    "activations": "what autograd saves in forward to compute backward; grows with batch x sequence",
    "logits": "batch x sequence x vocabulary scores, the loss's fp32 copies and their gradients",
    "temporaries": "short-lived full-size buffers: an optimizer's scratch, gathered or cast weights",
    "comm_buffers": "buckets that gradients pass through on their way to other GPUs",
    "checkpoint": "optimizer states loaded from disk while resuming",
    "pinned_overhead": "what page-locked host memory costs beyond its bytes (blocks rounded up)",
    "generation": "what generates completions between steps (GRPO): vLLM's share of the GPU, or generate's KV cache",
}

PHASE_LABELS = {
    "setup": "setup",
    "resume": "resume (load checkpoint)",
    "forward": "forward",
    "backward": "backward",
    "step": "optimizer step",
    "generation": "generation (between steps)",
    "steady": "later iterations (fwd+bwd)",
}

GLOSSARY = {
    "estimate": "arithmetic over named buffers (helpers.estimate): every figure a sum of buffers, each with its source",
    "dry run": "the full-size model's real training step executed on fake tensors: shapes and dtypes, no memory",
    "fake tensors": "PyTorch tensors that carry a shape, a dtype and a device but no data (FakeTensorMode)",
    "twin": "a tiny model of the same architecture (hidden 128, 2 layers, unless a notebook says otherwise), trained "
            "for real on this CPU",
    "scaled run": "the twin trained for real through the set-up's own engine (torch, DeepSpeed, FSDP2), memory counted",
    "census": "the tracker's count of every live tensor's bytes, by category and phase",
    "role": "where a tensor would live on a GPU machine (GPU or host): on a CPU both are one RAM, so a rule assigns it",
    "evidence kinds": "measured (the engine's own tensors) / placed by rule / re-enacted in torch / estimated",
    "re-enacted": "an engine that cannot run here rebuilt in torch with its buffer sizes, read from its source",
    "sub-group": "ZeRO-3 splits each rank's optimizer partition into groups of sub_group_size elements; offload and "
                 "its ratio move whole groups",
    "bucket": "a flat buffer gradients are copied into before they are reduced across GPUs (DDP, DeepSpeed)",
    "pinned memory": "page-locked host RAM: the GPU copies from it directly, it can never be swapped out",
    "all_live / all_cold": "DeepSpeed's estimators: _all_live counts a model object's parameters, _all_cold takes "
                           "the counts as numbers",
    "checkpoint": "a saved training state on disk (weights, optimizer states), loaded when a run resumes",
    "checkpointing": "gradient (activation) checkpointing: keep each layer's input only, recompute the rest in backward",
    "ZeRO-1/2/3": "DeepSpeed's sharding over data-parallel GPUs: 1 shards the optimizer states, 2 also the gradients, "
                  "3 also the weights (gathered layer by layer when used)",
    "FSDP2": "PyTorch's fully_shard: weights, gradients and optimizer states sharded over the GPUs, like ZeRO-3",
    "offload": "keeping optimizer states (and possibly weights) in host RAM, with the optimizer step run on the CPU",
    "LoRA": "training small low-rank adapters beside frozen weights: only the adapters get gradients and states",
    "8-bit AdamW": "bitsandbytes' AdamW with its two states stored in 8 bits (about 2 B/param instead of 8)",
    "MoE": "mixture of experts: many MLPs per layer, a few used per token; all of them are weights to store",
    "GiB / GB": "GiB = 2^30 bytes (nvidia-smi, PyTorch, DeepSpeed print these); GB = 10^9 bytes (disk and RAM specs)",
}


def check(kind: str, value, allowed: tuple) -> None:
    """ValueError naming `value` and what is allowed unless `value` is one of `allowed` (a typo in a category or a
    phase fails where the buffer is made, not as a KeyError later)."""
    if value not in allowed:
        raise ValueError(f"unknown {kind} {value!r}: allowed are {', '.join(allowed)}")
