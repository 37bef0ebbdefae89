"""Measured memory: the tracker, full-size dry runs on fake tensors, scaled real runs of tiny twins on this CPU and GPU
runs, all through one training loop (steps.run_steps)."""

from helpers.measure import fakegpu

if fakegpu.wanted():            # not in a process that runs CUDA's backward (the GPU mode's own: fakegpu.wanted)
    fakegpu.register_backend()  # before any backward pass in this process (see fakegpu.register_backend)

import warnings  # noqa: E402

# transformers 5 renamed is_gradient_checkpointing (to is_activation_checkpointing); peft 0.21 still reads the old
# name when it wraps a checkpointed model, which warns on every LoRA run. Nothing for a reader to act on.
warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
