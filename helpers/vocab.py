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

PHASE_LABELS = {
    "setup": "setup",
    "resume": "resume (load checkpoint)",
    "forward": "forward",
    "backward": "backward",
    "step": "optimizer step",
    "steady": "later iterations (fwd+bwd)",
}
