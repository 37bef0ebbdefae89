"""The training step every measuring mode runs: the dry run (fake tensors), the scaled run (the twin, in this process
or one process per rank under torchrun) and GPU mode share this one loop, so that a rule such as gradient
accumulation holds in all of them.

One iteration is `grad_accum` micro batches of forward and backward, then the optimizer step. The first iteration's
micro batches are the phases 'forward' and 'backward' (each keeps the worst micro batch), its step is 'step'; every
later iteration's forward and backward are 'steady'. Between micro batches an engine that has `micro_step` is told
(DeepSpeed's `engine.step()` inside an accumulation window only counts the micro batch). What a mode adds around the
phases (timings, RSS, torch.cuda statistics, a progress bar, the losses) comes through `Hooks`.
"""

from __future__ import annotations

import time


class Hooks:
    """What a mode does around each phase; every method does nothing here."""

    def before(self, phase: str, activity: str) -> None:
        """Called just before a phase starts (`activity`: 'forward', 'backward' or 'step')."""

    def after(self, phase: str, activity: str, seconds: float) -> None:
        """Called when a phase has ended, with its wall time (seconds, tracker included)."""

    def loss(self, iteration: int, loss) -> None:
        """The first micro batch's loss of each iteration (a tensor: a fake one in a dry run)."""


def phase_names(iteration: int) -> tuple[str, str]:
    """The phases of an iteration's forward and backward: ('forward', 'backward') first, then ('steady', 'steady')."""
    return ("forward", "backward") if iteration == 0 else ("steady", "steady")


def run_steps(engine, tracker, ids, grad_accum: int, iterations: int, last_step: bool = True,
              hooks: Hooks | None = None) -> None:
    """Run `iterations` training iterations of `engine` on the batch `ids` under `tracker`'s phases.

    `engine` has forward(ids) -> loss, backward(loss), step() and optionally micro_step(); `last_step=False` leaves out
    the last iteration's optimizer step (a dry run stops after the steady forward and backward)."""
    hooks = hooks or Hooks()
    for i in range(iterations):
        forward, backward = phase_names(i)
        for micro in range(grad_accum):
            if hasattr(engine, "syncing"):                  # FSDP: no_sync before the last micro batch
                engine.syncing(micro == grad_accum - 1)
            hooks.before(forward, "forward")
            started = time.perf_counter()
            with tracker.phase(forward, activity="forward"):
                loss = engine.forward(ids)
            hooks.after(forward, "forward", time.perf_counter() - started)
            if micro == 0:
                hooks.loss(i, loss)
            hooks.before(backward, "backward")
            started = time.perf_counter()
            with tracker.phase(backward, activity="backward"):
                engine.backward(loss)
                del loss
                if micro < grad_accum - 1 and hasattr(engine, "micro_step"):
                    engine.micro_step()
            hooks.after(backward, "backward", time.perf_counter() - started)
        if last_step or i < iterations - 1:
            hooks.before("step", "step")
            started = time.perf_counter()
            with tracker.phase("step"):
                engine.step()
            hooks.after("step", "step", time.perf_counter() - started)
