"""The one vocabulary of memory categories, phases and devices shared by estimates, measurements and plots."""

CATEGORIES = (
    "parameters",        # the weights the forward pass reads (compute copy; fp32 when they are also the master)
    "master_weights",    # an fp32 copy kept beside low-precision parameters, updated by the optimizer
    "gradients",         # gradients, including an engine's fp32 gradient partition
    "optimizer_states",  # AdamW exp_avg and exp_avg_sq
    "activations",       # tensors saved by autograd for backward (and a recomputed layer under checkpointing)
    "logits",            # logits, the loss's fp32 upcast, log-softmax output and their gradients
    "temporaries",       # short-lived full-size buffers: foreach AdamW temporaries, gathered/unsharded layers
    "comm_buffers",      # gradient buckets of DDP and DeepSpeed, reduce-scatter buffers
    "checkpoint",        # optimizer and master states loaded from disk while resuming
    "pinned_overhead",   # bytes the pinned host caching allocator adds by rounding each block up
)

PHASES = (
    "setup",     # model and engine built, before the first forward
    "resume",    # loading a checkpoint's optimizer states beside the live buffers (only when resuming)
    "forward",   # end of the first forward pass (loss computed)
    "backward",  # the first backward pass, at its highest point
    "step",      # the first optimizer step: where AdamW's states are created
    "steady",    # forward + backward of every later iteration, with optimizer states alive
)

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
}

PHASE_LABELS = {
    "setup": "setup",
    "resume": "resume (load checkpoint)",
    "forward": "forward",
    "backward": "backward",
    "step": "optimizer step",
    "steady": "later iterations (fwd+bwd)",
}
