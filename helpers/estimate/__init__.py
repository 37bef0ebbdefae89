"""The analytic memory estimator: pure arithmetic over a model's parameter inventory and a TrainSetup.

`estimate.run(model, setup)` returns a Result: per GPU and per node host, the bytes of each phase of a training step
(setup, with the model's loading, resume when asked, forward, backward, optimizer step, later iterations) by category,
the peak, and the first phase that overflows a given capacity. Each term is an Item; see states, activations, host and
loading for sources.
"""

from __future__ import annotations

import dataclasses
import datetime

from helpers import models, versions
from helpers.errors import InputError
from helpers.estimate import (
    accumulation,
    activations,
    adapters,
    generation,
    host,
    loading,
    parallel,
    reference,
    reward,
    saving,
    states,
)
from helpers.estimate.items import PHASE_MOMENTS, Item
from helpers.results import DeviceMemory, Result, empty_breakdown
from helpers.training import LOGPS_RUNS, TrainSetup, checked
from helpers.units import from_gib
from helpers.vocab import PHASES


def items(model, setup: TrainSetup, lifecycle: bool = True) -> list[Item]:
    """Every buffer of the set-up, with the moments it is alive; `lifecycle` False leaves out the model's loading and
    the checkpoint's save around the step."""
    m = models.spec(model)
    checked(setup)
    m.check_lora_rank(setup.lora_rank, setup.lora_targets)
    adapters.check(m, setup)
    if versions.older(setup, "moe_experts_fused") and any(t.ndim == 3 for t in m.tensors):
        raise InputError(f"{m.name} with transformers {versions.of(setup, 'transformers')[0]}: before 5.0 each routed "
                         f"expert is its own nn.Linear modules (bitsandbytes quantises them, LoRA adapts each), and "
                         f"this package models transformers 5's fused experts only; estimate it with transformers 5 "
                         f"(leave transformers out of versions)")
    parallel.check(m, setup)
    if setup.run == "rm":
        m = reward.spec(m, setup.rm_head)                            # a score head in place of the LM head
    whole, m = m, parallel.rank_model(m, setup.tensor_parallel)       # what one tensor-parallel rank holds
    b = states.Builder(reference.pairs(setup))       # DPO: chosen and rejected sequences in one forward
    states.add_model_states(b, m)
    activations.add_activations(b, m)
    if setup.run in LOGPS_RUNS:                       # DPO's, GRPO's log-probabilities
        reference.add_logits(b, m)
    elif setup.run == "rm":
        reward.add_score(b, m)
    else:
        activations.add_logits(b, m)
    accumulation.add_accumulation(b, m)
    if lifecycle:
        loading.add_load(b, m)
        if setup.checkpoint_saves:
            saving.add_save(b, m, whole)
    reference.add_reference(b, m, lifecycle)         # (after the save: a checkpoint holds the policy alone)
    if lifecycle and setup.run == "grpo":
        generation.add_generation(b, m)              # (after the reference: it is alive while generating)
    if setup.resume:
        host.add_resume(b, m)
    host.add_pinned_overhead(b)
    return b.items


def phases_of(setup: TrainSetup, lifecycle: bool = True) -> tuple[str, ...]:
    """The phases a set-up has: resume only when resuming, generation only for a GRPO run's whole life."""
    return tuple(p for p in PHASES if (p != "resume" or setup.resume)
                 and (p != "generation" or (lifecycle and setup.run == "grpo")))


def _device_memory(its: list[Item], device: str, phases, capacity_gib, moments: dict | None = None) -> DeviceMemory:
    """Per phase, the categories at its highest moment; `moments`, when given, receives that moment per phase."""
    breakdown = empty_breakdown(phases)
    for phase in phases:
        best = None
        for moment in PHASE_MOMENTS[phase]:
            alive = [i for i in its if i.device == device and moment in i.moments]
            total = sum(i.nbytes for i in alive)
            if best is None or total > best[0]:
                best = (total, alive, moment)
        for i in best[1]:
            breakdown[phase][i.category] += i.nbytes
        if moments is not None:
            moments[phase] = best[2]
    return DeviceMemory(breakdown, None if capacity_gib is None else from_gib(capacity_gib))


def run(model, setup: TrainSetup | None = None, lifecycle: bool = True, **options) -> Result:
    """Estimate memory for `model` (catalogue name, config path or ModelSpec) under `setup` (or TrainSetup(**options)).
    `lifecycle` False: the step alone, without the model's loading (helpers.estimate.loading) and the checkpoint's
    save (helpers.estimate.saving), which is what a dry run or a scaled run measures: they start from a model
    already built and save nothing."""
    setup = checked(TrainSetup() if setup is None else setup)
    if options:
        setup = setup.replace(**options)
    m = models.spec(model)
    if setup.run == "rm":
        m = reward.spec(m, setup.rm_head)                            # (its parameters: the LM head's replaced by the score's)
    its = items(m, setup, lifecycle)
    phases = phases_of(setup, lifecycle)
    peaks: dict[str, dict] = {}
    return Result(
        model=m.name, params=m.params, mode="estimate", setup=dataclasses.asdict(setup),
        gpu=_device_memory(its, "gpu", phases, setup.gpu_gib, peaks.setdefault("gpu", {})),
        host=_device_memory(its, "host", phases, setup.host_gib, peaks.setdefault("host", {})),
        items=[{"name": i.name, "category": i.category, "device": i.device, "bytes": i.nbytes,
                "phases": [p for p in phases if set(PHASE_MOMENTS[p]) & i.moments], "why": i.why,
                "pinned": i.pinned} for i in its],
        meta={"date": datetime.date.today().isoformat(), "versioned": versions.applied(setup, m),
              "loading": [{"name": i.name, "device": i.device, "bytes": i.nbytes} for i in its if "load" in i.moments],
              "loading_words": loading.words(setup, m) if lifecycle else None,
              "reference_words": reference.words(setup),
              "reward_words": reward.words(setup),
              "generation_words": generation.words(setup),
              "vllm_short": generation.vllm_short(setup, m),
              "saving": [{"name": i.name, "device": i.device, "bytes": i.nbytes, "moment": sorted(i.moments & saving.SAVE)}
                         for i in its if i.moments & saving.SAVE and not saving.PERSISTENT <= i.moments
                         and i.category != "pinned_overhead"],
              "peak_moments": peaks,
              "fsdp2_padding": states.fsdp2_padding(parallel.rank_model(m, setup.tensor_parallel), setup),
              "lora_unmatched": m.lora_unmatched(setup.lora_targets) if setup.lora_rank else []},
    )
