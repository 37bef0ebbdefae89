"""Items: one named buffer each (bytes, category, device) and the moments of a step at which it is alive.

A phase can hold several moments (backward: its start, with every activation saved, and its end, with every
gradient made); a phase's figure is its highest moment. This is the estimator's whole data model.
"""

from __future__ import annotations

from dataclasses import dataclass

from helpers.vocab import CATEGORIES, DEVICES, check

MOMENTS = (                  # in the order a run passes them ("from X on" is a slice of it)
    "load", "setup", "resume", "forward_init", "forward_start", "forward_gather", "forward", "backward_start",
    "backward_head", "backward_end", "backward_post", "backward_done", "step_norm", "step_prepare", "step", "save_model",
    "save_states", "sync_reference", "generate", "score", "steady_forward_start", "steady_forward_gather", "steady_forward", "steady_backward_start",
    "steady_backward_head", "steady_backward_end", "steady_backward_post", "steady_backward_done",
)
PHASE_MOMENTS = {
    "setup": ("load", "setup"),
    "resume": ("resume",),
    "forward": ("forward_init", "forward_start", "forward_gather", "forward"),
    "backward": ("backward_start", "backward_head", "backward_end", "backward_post", "backward_done"),
    "step": ("step_norm", "step_prepare", "step", "save_model", "save_states"),   # a checkpoint saved after a step
    "generation": ("sync_reference", "generate", "score"),   # between two steps (GRPO: helpers.estimate.generation):
    #                                                 the reference synced to the policy, completions generated, then
    #                                                 scored by no-grad forwards (OpenRLHF's make_experience)
    "steady": ("steady_forward_start", "steady_forward_gather", "steady_forward", "steady_backward_start", "steady_backward_head",
               "steady_backward_end", "steady_backward_post", "steady_backward_done"),
}

LOAD = frozenset({"load"})     # the model being loaded, before the engine is built (helpers.estimate.loading)
ALWAYS = frozenset(MOMENTS) - LOAD   # from the engine's set-up on: what loading holds is named on its own
LOSS = frozenset({"forward", "steady_forward"})                    # the loss being computed: logits alive
GATHER = frozenset({"forward_gather", "steady_forward_gather"})     # the output head's parameters being gathered
FORWARDS = LOSS | GATHER
START = frozenset({"forward_start", "steady_forward_start"})      # a forward's first groups, nothing saved yet
BWD_START = frozenset({"backward_start", "steady_backward_start"})  # the loss's backward, every activation saved
BWD_HEAD = frozenset({"backward_head", "steady_backward_head"})     # the output head's backward, activations saved
BWD_END = frozenset({"backward_end", "steady_backward_end"})        # backward of the first layer (the last to run)
BWD_DONE = frozenset({"backward_done", "steady_backward_done"})     # every gradient made
BWD_POST = frozenset({"backward_post", "steady_backward_post"})     # a block's post-backward (FSDP2), its
#                                                                   activations and working set freed
FWD_BWD = FORWARDS | START | BWD_START | BWD_HEAD | BWD_END
GRADS = BWD_END | BWD_POST | BWD_DONE | {"step_norm", "step"}        # made in backward, freed after the step
STATES = frozenset({"step_norm", "step", "steady_forward_start", "steady_forward_gather", "steady_forward", "steady_backward_start",
                    "steady_backward_head", "steady_backward_end", "steady_backward_post", "steady_backward_done"})
STEP = frozenset({"step"})
GENERATE = frozenset({"generate"})
SYNC_REFERENCE = frozenset({"sync_reference"})
SCORE = frozenset({"score"})                                # the samples scored (no-grad forwards) before the step
BETWEEN_STEPS = GENERATE | SYNC_REFERENCE | SCORE
STEP_NORM = frozenset({"step_norm"})                        # the step's gradient norm, before anything is flattened
STEP_PREPARE = frozenset({"step_prepare"})                  # before the update: gradients flattened, cast to fp32
FORWARD_INIT = frozenset({"forward_init"})                  # the first forward's start: an engine's lazy initialisation


@dataclass(frozen=True)
class Item:
    """One buffer: `nbytes` on `device` ('gpu' per GPU, 'host' per node), alive at `moments`; `why` cites its source."""

    name: str
    category: str
    device: str
    nbytes: int
    moments: frozenset
    why: str = ""
    blocks: tuple = ()
    """Pinned (page-locked) allocations making up this item, in bytes; empty when pageable."""

    def __post_init__(self):
        check("category", self.category, CATEGORIES)
        check("device", self.device, DEVICES)

    @property
    def pinned(self) -> bool:
        return bool(self.blocks)
