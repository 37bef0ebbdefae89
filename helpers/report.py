"""Readable text of a Result: phases x devices in GiB, the categories at each peak, the verdict."""

from __future__ import annotations

from helpers import evidence, gpus, strategies, versions
from helpers.results import Result
from helpers.training import PAIRED_RUNS
from helpers.units import MiB, fmt, scale, to_gib
from helpers.vocab import PHASE_LABELS

PER_DEVICE = {"gpu": "per GPU", "host": "host per node"}     # how an item's bytes are counted, in words


def loading_bytes(r: Result, device: str) -> int:
    """Bytes held on `device` while the model loads (the estimate's load moment, part of its setup phase)."""
    return sum(i["bytes"] for i in r.meta.get("loading") or () if i["device"] == device)


def loading_lines(r: Result) -> list[str]:
    """What loading the model holds (helpers.estimate.loading), where it holds anything."""
    items, said = r.meta.get("loading") or [], r.meta.get("loading_words")
    if not items and not said:
        return []
    return ["", "loading the model (part of setup): " + "; ".join(
        [f"{i['name']}, {fmt(i['bytes'])} {PER_DEVICE[i['device']]}" for i in items] + ([said] if said else []))]


def pairs_word(s) -> str:
    """' pairs' where the micro batch counts pairs (DPO, reward models: chosen and rejected in one forward)."""
    return " pairs" if s.run in PAIRED_RUNS else ""


def reference_lines(r: Result) -> list[str]:
    """A DPO run's pairs and reference model (helpers.estimate.reference), a GRPO run's completions, reference and
    generation (helpers.estimate.generation), a reward model's pairs and head (helpers.estimate.reward); [] for SFT."""
    if r.meta.get("reward_words"):
        return ["", r.meta["reward_words"]]
    said = r.meta.get("reference_words")
    if not said:
        return []
    if r.setup.get("run") == "grpo":
        return grpo_lines(r, said)
    ref = [i for i in r.items if i["name"].startswith("reference model")]
    held = "".join(f", {fmt(i['bytes'])} {PER_DEVICE[i['device']]}" for i in ref)
    b, how = r.setup["batch"], r.setup.get("dpo_logps", "logsumexp")
    way = ("a logsumexp per sequence over fp32 logits, the logits kept for backward (TRL's way)" if how == "logsumexp"
           else "a log_softmax over fp32 logits, its output kept for backward (LLaMA-Factory's way)")
    if strategies.get(r.setup["strategy"]).deepspeed and how == "logsumexp":
        way = ("a log_softmax per sequence over the bf16 logits, each kept for backward (TRL's way under DeepSpeed, "
               "where accelerate wraps no autocast)")
    caveat = ""
    beside = "" if r.setup.get("reference") == "none" else ", with the reference's logits scored beside them"
    if r.setup.get("fused_ce"):
        caveat += ("; fused_ce does not reach the log-probabilities here: the full logits are counted (Liger's "
                   "fused losses, TRL's use_liger_kernel, would hold less)")
    if r.setup.get("run") == "kto":
        through = "the policy" + ("" if r.setup.get("reference") == "none" else " and the reference")
        runs = (f"KTO: each forward runs {b} unpaired sequences, and first {b} mismatched ones of the KL term through "
                f"{through} under no_grad (below the step's moments)")
    else:
        runs = f"DPO: each forward runs {b} chosen and {b} rejected sequences ({2 * b} x seq)"
    return ["", f"{runs}; reference model: {said}{held}. Log-probabilities: {way}{beside} (measured by a dry run of "
                f"the step re-enacted{caveat})"]


def grpo_lines(r: Result, said: str) -> list[str]:
    """A GRPO run: the completion's logits, the reference, the generation between steps."""
    from helpers.training import TrainSetup

    s = TrainSetup(**r.setup)
    ref = [i for i in r.items if i["name"].startswith("reference model")]
    held = "".join(f", {fmt(i['bytes'])} {PER_DEVICE[i['device']]}" for i in ref)
    kept = ("in bf16, with each sequence's log_softmax kept for backward (DeepSpeed: accelerate wraps no fp32 "
            "output)" if s.strat.deepspeed else "in fp32 (accelerate's copy), kept for the log-probabilities' "
                                                 "backward")
    caveat = ("; fused_ce (use_liger_kernel) does not reach GRPO's log-probabilities here: the completion's logits are "
              "counted in full (Liger's fused GRPO loss would hold less)" if s.fused_ce else "")
    if s.dpo_logps == "openrlhf":
        from helpers.estimate import openrlhf_actor

        ce = ("flash-attn's Triton cross-entropy (flash_attention_2 needs flash-attn)" if openrlhf_actor.triton_ce(s)
              else "gather less a chunked logsumexp (no flash-attn with this attention)")
        lines = ["", f"OpenRLHF actor (train_ppo_ray): sequences of {s.seq} tokens, every position's logits copied "
                     f"to fp32 and held by the output through backward and the optimizer step, log-probabilities by "
                     f"{ce}" + (", the entropy's softmax kept with them" if s.entropy_kept else "")
                 + f" (the rule checked by dry runs of OpenRLHF's step re-enacted); the loss over the last {s.completion_tokens}; "
                   f"reference model sharing the GPU: {said}{held}"]
    else:
        lines = ["", f"GRPO: sequences of {s.seq} tokens, the last {s.completion_tokens} a completion whose logits "
                     f"alone are made (logits_to_keep), {kept} (a dry run of TRL's step re-enacted agrees{caveat}); "
                     f"reference model: {said}{held}"]
    gen = r.meta.get("generation_words")
    if gen:
        lines.append(f"generation between steps: {gen}" + ("" if "generation" in r.gpu.phases else
                                                            " (not in this figure: the step alone)"))
    return lines


def loss_lines(r: Result) -> list[str]:
    """TRL's SFT loss (trl_loss_type): what its release computes, or why the full logits are counted instead."""
    if not r.setup.get("trl_loss_type"):
        return []
    from helpers.estimate import sft_loss
    from helpers.training import TrainSetup

    s = TrainSetup(**r.setup)
    why = sft_loss.unmodelled(s)
    if why:
        return ["", why]
    how = {sft_loss.FULL: "the model's own loss over the full logits",
           sft_loss.CHUNKED: "the loss 256 tokens at a time under checkpoint (chunked_nll)",
           sft_loss.TILED: "the loss through its fused LM head, in tiles of 4096 tokens x 32768 vocabulary entries"}
    release = versions.of(s, "trl")[0]
    return ["", f"loss: TRL {release or '(newest rules)'} with loss_type {s.trl_loss_type} computes "
                f"{how[sft_loss.mechanism(s)]} (--versions trl=X for your release); the dry run re-enacts it "
                f"(helpers.measure.trl_loss)"]


def accumulation_lines(r: Result) -> list[str]:
    """How FSDP accumulates gradients (helpers.estimate.accumulation), where it accumulates under FSDP."""
    s = r.setup
    if s.get("grad_accum", 1) <= 1 or s["strategy"] not in ("fsdp1", "fsdp2"):
        return []
    held = [i for i in r.items if "under no_sync" in i["name"]]
    if not held:
        return ["", f"gradient accumulation ({s['grad_accum']} micro batches): reduce-scattered after every micro "
                    f"batch (sync_each_batch: torchtitan's and torchtune's loops), so only the gradient shards are "
                    f"kept between micro batches"]
    return ["", f"gradient accumulation ({s['grad_accum']} micro batches): every micro batch but the last runs under "
                f"no_sync, as the HF Trainer (TRL, axolotl, LLaMA-Factory) and accelerate run it, so each GPU keeps "
                f"the whole unsharded gradient between micro batches, {fmt(held[0]['bytes'])} per GPU; "
                f"--sync-each-batch (TRL: accelerator_config: {{gradient_accumulation_kwargs: {{sync_each_batch: "
                f"true}}}}) reduce-scatters each micro batch instead"]


def saving_lines(r: Result) -> list[str]:
    """What saving a checkpoint holds beside what outlives the step (helpers.estimate.saving), where it holds any."""
    items = r.meta.get("saving") or []
    if not r.setup.get("checkpoint_saves", True) and r.mode == "estimate":
        return ["", "saving a checkpoint: not counted, the set-up saves none (checkpoint_saves false: a file's "
                    "save_strategy no, torchtitan without checkpoint.enable, or --no-checkpoint-saves)"]
    if not items:
        return []
    said = lambda xs: "; ".join(f"{i['name']}, {fmt(i['bytes'])} {PER_DEVICE[i['device']]}" for i in xs)
    model = [i for i in items if "save_model" in i["moment"]]
    states = [i for i in items if "save_model" not in i["moment"]]
    if model and states:            # two moments, one after the other: the step's figure counts the larger
        return ["", f"saving a checkpoint (after an optimizer step, counted in it): first the model, {said(model)}; "
                    f"then the optimizer, {said(states)} (one after the other: the larger counts)"]
    return ["", "saving a checkpoint (after an optimizer step, counted in it): " + said(items)]


def while_saving(r: Result, device: str, phase: str) -> bool:
    """Whether `phase`'s figure on `device` is the moment a checkpoint is saved (the estimate's save moments)."""
    from helpers.estimate.saving import SAVE

    return phase == "step" and ((r.meta.get("peak_moments") or {}).get(device) or {}).get(phase) in SAVE


def verdict(r: Result) -> str:
    """One line: 'fits: 61.2 of 80 GiB per GPU ...' or 'OOM on GPU at the optimizer step (...)'."""
    oom = r.oom
    observed = r.meta.get("oom_observed")
    if observed:
        asked = observed.get("requested_bytes")
        held = (observed.get("cuda_stats") or {}).get("allocated")
        detail = ", ".join(x for x in (f"it asked for {fmt(asked)}" if asked else "",
                                        f"{fmt(held)} allocated" if held else "") if x)
        return (f"OOM observed on the GPU during the {PHASE_LABELS.get(observed.get('phase'), observed.get('phase'))}"
                + (f" ({detail})" if detail else "") + ": caught, its memory freed")
    if not r.gpu.breakdown and not r.host.breakdown:
        return "no phases recorded: nothing to compare with a capacity"
    if oom["device"]:
        d = r.device(oom["device"])
        later = (f" (its peak comes later: {fmt(d.peak_bytes)} at the {PHASE_LABELS[d.peak_phase]})"
                 if d.peak_phase != oom["phase"] and d.peak_bytes > d.phases[oom["phase"]] else "")
        loading = oom["phase"] == "setup" and loading_bytes(r, oom["device"]) > d.capacity_bytes
        return (f"OOM on {oom['device'].upper()} at the {PHASE_LABELS[oom['phase']]}"
                f"{', while the model loads' if loading else ''}"
                f"{', while the checkpoint is saved' if while_saving(r, oom['device'], oom['phase']) else ''}: "
                f"{fmt(d.phases[oom['phase']])} needed there, {fmt(d.capacity_bytes)} available{later}")
    total = device_total_oom(r)
    if total:
        return total
    short = r.meta.get("vllm_short")
    if short:
        return (f"vLLM will not start: its share, {fmt(short['share'])} (vllm_gpu_memory_utilization "
                f"{r.setup['vllm_share']:g}), does not hold its own 16-bit weights, {fmt(short['weights'])}, and leaves "
                f"no KV cache (vLLM gpu_worker.py: the KV cache is what the share leaves): raise "
                f"vllm_gpu_memory_utilization above {short['weights'] / (r.gpu.capacity_bytes or 1):.2f}, or split "
                f"vLLM's weights with vllm_tensor_parallel_size (the training itself: "
                + _fits_words(r)[len("fits: "):] + ")")
    return _fits_words(r)


def _fits_words(r: Result) -> str:
    """'fits: ...' with each device's peak and capacity, or 'needs: ...' where no capacity is given."""
    parts = []
    for name, label in (("gpu", "per GPU"), ("host", "host per node")):
        d = r.device(name)
        if name == "host" and not d.peak_bytes and not d.capacity_bytes or not d.breakdown:
            continue                          # nothing on the host and no capacity to compare with
        judged = any(r.device(n).capacity_bytes for n in ("gpu", "host"))
        cap = f" of {fmt(d.capacity_bytes)}" if d.capacity_bytes else ""
        unjudged = (f"; not judged: no {'GPU' if name == 'gpu' else 'host'} capacity given"
                    if judged and not d.capacity_bytes else "")
        extra = sum(preset_parts(r).values()) if name == "gpu" else 0
        total = f", {fmt(d.peak_bytes + extra)} with {_overhead_words(r)}" if extra else ""
        parts.append(f"{fmt(d.peak_bytes)}{cap} {label} (peak at {PHASE_LABELS[d.peak_phase]}{total}{unjudged})")
    return ("fits: " if any(r.device(n).capacity_bytes for n in ("gpu", "host")) else "needs: ") + "; ".join(parts)


def _overhead_words(r: Result) -> str:
    """What an estimate's device total adds to its tensors, in words: the CUDA context (said to be assumed where it
    was not measured on this GPU), cuBLAS's workspaces, and NCCL's buffers where there are any."""
    parts = preset_parts(r)
    ctx = gpus.cuda_context(r.meta.get("gpu_preset"))
    short = ctx.get("gpu", "").removeprefix("NVIDIA ").split(" ")[0]
    preset = r.meta.get("gpu_preset")
    assumed = (f" ({'none measured on ' + preset + ': ' if preset else ''}an {short}'s, assumed)"
               if "assumed" in ctx.get("note", "") else "")
    if parts.get("nccl_buffers"):
        return f"the CUDA context{assumed}, cuBLAS's workspaces and NCCL's buffers"
    return f"the CUDA context{assumed} and cuBLAS's workspaces"


def preset_parts(r: Result) -> dict[str, int]:
    """What an estimate with a GPU capacity holds on each GPU beyond the tensors: {'cuda_context',
    'cublas_workspaces', 'nccl_buffers'} (helpers.gpus.overhead) of its preset (meta 'gpu_preset', set by --gpu), or
    with --gpu-gib alone of no GPU named (the context measured after a training step, cuBLAS's larger workspaces), as
    the dry run's device total counts them; {} without a GPU capacity."""
    if r.mode != "estimate" or not r.gpu.capacity_bytes:
        return {}
    return gpus.overhead(r.setup["strategy"], r.setup["gpus"], r.meta.get("gpu_preset"))


def device_total_oom(r: Result) -> str | None:
    """For an estimate whose tensors fit the GPU's capacity but whose device total (tensors + CUDA context + cuBLAS
    workspaces + NCCL buffers) does not: the verdict line saying so (as `fit` judges it); None otherwise."""
    parts, cap = preset_parts(r), r.gpu.capacity_bytes
    extra = sum(parts.values())
    if not extra or not cap or r.gpu.peak_bytes + extra <= cap:
        return None
    part = gpus.pushed_over(r.gpu.peak_bytes, r.gpu.peak_bytes, parts, cap)
    return (f"OOM on GPU with the device total: {to_gib(r.gpu.peak_bytes + extra):.1f} of {to_gib(cap):.1f} GiB "
            f"(tensors {to_gib(r.gpu.peak_bytes):.1f} + {to_gib(extra):.1f} for {_overhead_words(r)}): "
            f"{gpus.PART_LABELS[part or 'cuda_context']} tips it over")


def versioned_lines(r: Result) -> list[str]:
    """The rules that changed across library releases and bore on the result's set-up, with the release each ran at
    (as the result recorded them; a result without the record: as they stand here)."""
    s = r.train_setup
    rules = r.meta.get("versioned")
    if rules is None:
        rules = versions.applied(s)
    if rules:
        return ["", "versioned rules (helpers.versions):"] + [f"  {versions.line(x)}" for x in rules]
    if s.versions:
        return ["", f"versions {s.versions}: no rule that changed across these releases bears on this set-up"]
    return []


def lora_words(s) -> str:
    """', LoRA r16 (fp32 adapters, nf4 base)' for a LoRA set-up, '' otherwise."""
    if s.lora_rank is None:
        return ""
    adapters = "fp32" if s.adapters_fp32 else s.half          # (adapters_fp32 holds for precision fp32)
    return f", LoRA r{s.lora_rank} ({adapters} adapters" + (f", {s.base_weights} base)" if s.base_weights else ")")


def offload_ratio_lines(r: Result) -> list[str]:
    """ZeRO-3's partial offload in words: the sub-groups the ratio puts on the host (DeepSpeed moves whole ones) and
    their elements."""
    s = r.train_setup
    if s.strategy != "zero3" or not s.offload_optimizer or s.offload_ratio is None:
        return []
    from helpers import models, step_cost

    groups, first = step_cost.host_sub_groups(models.spec(r.model), s)
    n = len(groups)
    host = sum(groups[first:])
    moved = (f"sub-groups {first}..{n - 1} of {n} on the host, {host:,} of each rank's {sum(groups):,} optimizer "
             f"elements ({host / sum(groups):.2%})" if first < n else f"none of the {n} sub-groups on the host")
    return ["", f"offload ratio {s.offload_ratio:g}: {moved} (DeepSpeed 0.19.8 stage3.py moves whole sub-groups: "
                f"sub-group i is on the host when i >= int((1 - ratio) x {n}); each rank's {n} come from its "
                f"partition in sub_group_size {s.sub_group_size:.0e} pieces, per optimizer parameter group: "
                f"optimizer_groups '{s.optimizer_groups}')"]


def table(r: Result) -> str:
    """The result as text, in GiB (2**30 bytes), or MiB (2**20) when everything is under 1 GiB (a scaled twin)."""
    unit, div = scale([r.gpu.peak_bytes, r.host.peak_bytes])
    big = unit == "GiB"
    conv = lambda b: b / div
    s = r.train_setup
    lines = [f"{r.model}: {r.params:,d} parameters, {s.strategy} on {s.gpus} GPU(s){s.degrees.describe()}, "
             f"{s.precision}{lora_words(s)}, batch {s.batch}{pairs_word(s)} x seq {s.seq}   [{r.mode}; "
             f"{unit} = 2^{30 if big else 20} bytes]",
             "", f"{'phase (' + unit + ')':30s}{'GPU (each)':>14s}{'host (node)':>14s}"
             + (f"{'GPU reserved':>14s}{'+context':>10s}" if r.gpu.reserved else "")]
    lines.insert(1, f"evidence: {evidence.detail(r)}")
    if r.meta.get("device"):
        lines.insert(2, f"measured on: {r.meta['device']}; {r.meta.get('wall_s', '?')} s; {r.meta.get('date', '')}")
        lines.insert(3, f"engine: {r.meta.get('engine', '?')}" + (f"; {r.meta['note']}" if r.meta.get("note") else ""))
    total = r.gpu.device_total or {}
    for phase, gpu_bytes in r.gpu.phases.items():
        lines.append(f"{PHASE_LABELS[phase]:30s}{conv(gpu_bytes):14.2f}{conv(r.host.phases.get(phase, 0)):14.2f}"
                     + (f"{conv(r.gpu.reserved[phase]):14.2f}{conv(total[phase]):10.2f}" if phase in total else ""))
    if r.gpu.reserved:
        lines.append(reserved_note(r))
    if not r.gpu.phases:
        lines.append("(no phases recorded)")
    for name in ("gpu", "host"):
        d = r.device(name)
        cats = {c: v for c, v in d.categories.items() if v}
        if cats:
            lines += ["", f"{name} at its peak ({PHASE_LABELS[d.peak_phase]}):"]
            lines += [f"  {c:28s}{conv(v):14.2f}" for c, v in cats.items()]
    lines += versioned_lines(r)
    if r.meta.get("losses"):
        lines += ["", "losses: " + ", ".join(f"{x:.3f}" for x in r.meta["losses"])]
    if r.meta.get("rss_bytes"):
        lines.append("process RSS at the end of each phase (MiB, everything the process holds): " + ", ".join(
            f"{p} {v / MiB:.0f}" for p, v in r.meta["rss_bytes"].items()))
    lines += loading_lines(r)
    lines += reference_lines(r)
    lines += loss_lines(r)
    lines += accumulation_lines(r)
    lines += offload_ratio_lines(r)
    lines += saving_lines(r)
    if not any(r.host.phases.values()):
        lines += ["", "host: nothing offloaded (the processes' own RAM, data loaders and the CUDA context are not counted)"]
    device = device_verdict(r)
    caution = reserve_caution(r)
    lines += ["", verdict(r)] + ([device] if device else []) + ([caution] if caution else [])
    unmatched = r.meta.get("lora_unmatched")
    if unmatched:
        lines.append(f"LoRA: {', '.join(unmatched)} match no module of {r.model}: peft adapts the other names and "
                     f"drops these (it fails only when no name matches)")
    pad = r.meta.get("fsdp2_padding")
    if pad:
        lines.append(f"FSDP2 pads: {pad['tensors']} tensors have fewer rows than the {pad['ranks']} ranks sharding them "
                     f"({pad['example']}: {pad['rows']} rows), so each rank keeps a whole row of each, "
                     f"{pad['times']:.1f}x its 1/{pad['ranks']} share, and every all-gather moves {pad['ranks']} rows "
                     f"of them: past {pad['rows']} ranks more GPUs do not shrink them (expert parallelism would)")
    if r.mode == "scaled":
        lines.append("(the tiny twin's own figures, to check the rules on a real step: the full-size model's come from "
                     "`estimate` or `measure --mode dry-run`)")
    return "\n".join(lines)


GRID_FILE = "dryrun_vs_estimate.json"     # under data/results/: `python -m helpers bench dryrun`'s table


def grid_reserve_ratios() -> list[float]:
    """Per set-up of the recorded dry-run grid: the caching allocator's modelled reserved peak over the tensors'
    allocated peak (each a dry run of the real step on fake tensors); [] without the file."""
    import json

    from helpers import models

    path = models.DATA_DIR / "results" / GRID_FILE
    if not path.exists():
        return []
    out = []
    for row in json.loads(path.read_text())["rows"]:
        g = row["dry_run"]["gpu"]
        if g.get("reserved") and g["peak_bytes"]:
            out.append(max(g["reserved"].values()) / g["peak_bytes"])
    return out


def unmodelled_caution(r: Result, imported, any_verdict: bool = False) -> str | None:
    """For a set-up read from files that fits (or, `any_verdict`, whatever its verdict: `fit` and `fixes` answer
    with other set-ups that fit): one line naming the settings listed as not modelled whose reason says the real
    figure is higher than the estimate (a colocated vLLM's share, a reference model, trained copies of modules, ...),
    so that "fits" is read as "fits for what is modelled". None when nothing listed raises it."""
    if imported is None or not (any_verdict or verdict(r).startswith("fits")):
        return None
    raising = list(dict.fromkeys(n.key for n in imported.not_modelled if "higher" in n.why))
    if not raising:
        return None
    head = "every 'fits' below holds only for what is modelled" if any_verdict else "fits only for what is modelled"
    return (f"{head}: {len(raising)} setting{'s' if len(raising) > 1 else ''} listed as not "
            f"modelled raise{'s' if len(raising) == 1 else ''} the real figure above this estimate "
            f"({', '.join(raising)})")


def world_caution(setup: dict, imported, overrides) -> str | None:
    """For a set-up (`setup`, a TrainSetup's fields) read from files that name no world size (1 GPU assumed,
    `Record.gpus_unknown`) under a strategy that shards over the GPUs: one line saying the figure is for one GPU and
    how to give the run's own count. None otherwise, or where a flag gave the count."""
    from helpers import strategies
    from helpers.readers.provenance import GPUS_UNKNOWN_TOOL

    if imported is None or setup.get("gpus") != 1 or any(o.get("field") == "gpus" for o in overrides or ()):
        return None
    if not any(d.key == "gpus" and d.tool == GPUS_UNKNOWN_TOOL for d in imported.defaults):
        return None
    st = strategies.get(setup["strategy"])
    if not st.shards:
        return None
    return (f"the files do not say how many GPUs the run uses: 1 is assumed, and {st.name} on one GPU shards "
            f"nothing; pass --gpus N (and --gpus-per-node) for the run's world size")


def _vllm_at_peak(r: Result) -> int:
    """The bytes of a colocated vLLM's budget in the GPU's peak phase (0 where none is there)."""
    from helpers.estimate import generation
    from helpers.training import TrainSetup

    s = r.setup
    if s.get("run") != "grpo" or s.get("generation") != "vllm-colocate":
        return 0
    share = generation.share_bytes(TrainSetup(**s)) or 0
    return min(share, r.gpu.breakdown[r.gpu.peak_phase].get("generation", 0))


def reserve_caution(r: Result) -> str | None:
    """For an estimate that fits a GPU capacity with less headroom than the caching allocator took on the recorded
    dry-run grid: one line saying so, with the grid's median and largest reserve above the tensors, and how to see
    this set-up's own (a dry run replays the allocator). The estimate's figures and verdict are unchanged: the line
    only says what they leave out. None otherwise."""
    import statistics

    d = r.gpu
    if r.mode != "estimate" or not d.capacity_bytes or r.oom["device"] or not d.peak_bytes:
        return None
    ratios = grid_reserve_ratios()
    if not ratios:
        return None
    if device_total_oom(r):
        return None
    extra = sum(preset_parts(r).values())                                # a preset's CUDA context, cuBLAS and NCCL
    vllm = _vllm_at_peak(r)          # vLLM's budget is its own pools, not torch's caching allocator: no reserve on it
    room = (d.capacity_bytes - extra - vllm) / (d.peak_bytes - vllm) - 1
    most, median = max(ratios) - 1, statistics.median(ratios) - 1
    if room >= most:
        return None
    risk = "likely" if room < median else "possible"
    counts = "tensors, the CUDA context and cuBLAS's workspaces" if extra else "tensors"
    if vllm:
        counts += f" (the headroom is taken on torch's share: vLLM's {fmt(vllm)} is a fixed budget of its own)"
    return (f"headroom {room:.0%}: OOM from the allocator's cache is {risk}. This estimate counts {counts}; on the "
            f"{len(ratios)} dry-run set-ups of data/results/{GRID_FILE} the caching allocator reserved a median "
            f"{median:.0%} (up to {most:.0%}) above them. `measure --mode dry-run` replays it on this set-up")


def reserved_note(r: Result) -> str:
    """What the reserved and +context columns are, and where their figures come from."""
    a, o = r.meta.get("allocator") or {}, r.gpu.overhead or {}
    if r.mode == "gpu":
        return (f"GPU reserved: measured (torch.cuda.max_memory_reserved per phase). +context: reserved + "
                f"{o.get('outside_allocator', 0) / MiB:.0f} MiB that torch.cuda.mem_get_info showed in use outside the "
                f"allocator after setup (CUDA context, NCCL, other processes): what nvidia-smi shows")
    how = (f"modelled: PyTorch's caching-allocator rules ({a.get('config', 'default')}) replayed on the step's "
           f"allocations")
    ctx, nccl = a.get("cuda_context") or {}, a.get("nccl_buffers") or {}
    return (f"GPU reserved: {how}. +context: reserved + CUDA context {o.get('cuda_context', 0) / MiB:.0f} MiB "
            f"({ctx.get('applies_to', 'measured')}; {ctx.get('url', '')}) + NCCL buffers "
            f"{o.get('nccl_buffers', 0) / MiB:.0f} MiB ({nccl.get('detail', '')}): what nvidia-smi would show")


def device_verdict(r: Result) -> str | None:
    """One line on the device total (reserved + context + NCCL) against the capacity; None without a reserved view
    or a capacity."""
    v = (r.meta.get("allocator") or {}).get("verdict")
    if not v or not r.gpu.device_total:
        return None
    peak = max(r.gpu.device_total.values())
    cap = fmt(r.gpu.capacity_bytes)
    if v["fits"]:
        how = (f" only if the allocator frees its cache and retries: with its cache it would need {fmt(peak)}, more "
               f"than the {cap} there is (PyTorch frees cached blocks when an allocation fails and tries again; "
               f"fragmented blocks can still fail it)" if v["released_cache"] else f": {fmt(peak)} at most")
        return f"device total (reserved + context + cuBLAS workspaces + NCCL) fits in {cap}{how}"
    return (f"device total: OOM at the {PHASE_LABELS.get(v['phase'], v['phase'])} (a {fmt(v['requested_bytes'])} "
            f"request; {fmt(v['allocated_bytes'])} allocated, {fmt(v['reserved_bytes'])} reserved, of {cap}): "
            f"{gpus.PART_LABELS[v['part']]} took it over")


def items_table(r: Result) -> str:
    """Every named buffer behind the figures: device, GiB, the phases it is alive in, and where it comes from."""
    lines = [f"{'device':7s}{'GiB':>9s}  {'category':18s}{'alive in':36s}buffer"]
    for i in sorted(r.items, key=lambda i: (i["device"] != "gpu", -i["bytes"])):
        lines.append(f"{i['device']:7s}{to_gib(i['bytes']):9.2f}  {i['category']:18s}{','.join(i['phases']):36s}{i['name']}")
        if i["why"]:
            lines.append(f"{'':72s}  ({i['why']})")
    return "\n".join(lines)


def imported_table(imported, overrides=()) -> str:
    """Where each setting of a `--from` set-up came from: setting, value, and a file:line or a tool's default; the
    flags that replaced a file's value; then, compact, what the files set that is not modelled and what was ignored.
    `imported` is a helpers.readers.Imported; `overrides` the CLI's list ({flag, field, value, replaced, from})."""
    def short(v, most: int = 40) -> str:
        text = str(v)
        return text if len(text) <= most else text[:most - 3] + "..."

    lines = [f"imported ({imported.format}): {', '.join(imported.files)}"
             + (f"; model named {imported.model_named!r}" if imported.model_named else ""),
             f"  {'setting':44s}{'value':>14s}  {'sets':36s}from"]
    for x in imported.settings:
        where = f"{x.file}:{x.line}" if x.line else x.file
        lines.append(f"  {short(x.key, 44):44s}{short(x.value, 14):>14s}  {short(x.sets, 35):36s}{where}")
    for d in imported.defaults:
        lines.append(f"  {short(d.key, 44):44s}{short(d.value, 14):>14s}  {short(d.sets, 35):36s}default ({d.tool})")
    for o in overrides:
        lines.append(f"  {o['flag']:44s}{short(o['value'], 14):>14s}  {short(o['field'] + '=' + str(o['value']), 35):36s}"
                     + (f"restated under the flags: was {short(o['replaced'])} from {o['from']}"
                        if o.get("implied") else
                        f"flag, overrides {short(o['replaced'])} from {o['from']}" if o["replaced"] is not None
                        else "flag (" + ("the files do not set it" if o["from"].startswith("this package's default")
                                         else o["from"]) + ")"))
    if imported.not_modelled:
        lines.append("  not modelled: " + "; ".join(f"{x.key}={short(x.value)} ({x.file}"
                                                    f"{'' if x.line is None else f':{x.line}'}: {x.why})"
                                                    for x in imported.not_modelled))
    if imported.ignored:
        lines.append("  ignored (no effect on memory): " + ", ".join(x.key for x in imported.ignored))
    return "\n".join(lines)


def imported_markdown(imported) -> str:
    """The same provenance as `imported_table`, as a Markdown table for a notebook: key, value, what it sets, and
    where it came from (file:line, or the tool's default with where that default is written); then what is not
    modelled and what was ignored. Introduced in notebooks/07."""
    from pathlib import Path

    cell = lambda v: str(v).replace("|", "\\|").replace("\n", " ")
    where = lambda x: Path(x.file).name + (f":{x.line}" if x.line else "")
    rows = ["| setting | value | sets | from |", "|---|---|---|---|"]
    rows += [f"| `{x.key}` | `{cell(x.value)}` | {cell(x.sets)} | {where(x)} |" for x in imported.settings]
    rows += [f"| `{d.key}` | `{cell(d.value)}` | {cell(d.sets)} | default: {cell(d.tool)}"
             + (f" ({cell(d.source)})" if d.source else "") + " |" for d in imported.defaults]
    out = "\n".join(rows)
    if imported.not_modelled:
        out += "\n\n**Not modelled** (they change memory; the figures below are made without them):\n\n" + "\n".join(
            f"- `{x.key}` = `{cell(x.value)}` ({where(x)}): {x.why}" for x in imported.not_modelled)
    if imported.ignored:
        out += "\n\n**Ignored** (no effect on memory): " + ", ".join(f"`{x.key}`" for x in imported.ignored)
    return out


def compare(rows, tol: float, names: tuple[str, str] = ("estimate", "measured"), floor: int = 0,
            title: str | None = None) -> dict:
    """Print two figures per row and their difference, and assert each row within `tol`: for rows (label, a, b) of
    bytes, |a - b| <= tol x max(b, floor) (`floor`: bytes under which a row is judged on `floor`, where b is near
    empty). The table is in GiB, or MiB when every figure is under 1 GiB; `names` head the two columns. An
    AssertionError names the row, both figures and the tolerance. Returns {label: (a - b) / b} (0 where b is 0).
    The one comparison the notebooks make between an estimate and a dry run or a measurement."""
    rows = [(str(label), int(a), int(b)) for label, a, b in rows]
    unit, div = scale([v for _, a, b in rows for v in (a, b)])
    width = max([len(label) for label, _, _ in rows] + [len(title or "")], default=0) + 2
    print(f"{title or '':{width}s}{names[0]:>14s}{names[1]:>14s}{'difference':>12s}   ({unit})")
    out = {}
    for label, a, b in rows:
        out[label] = (a - b) / b if b else 0.0
        print(f"{label:{width}s}{a / div:14.3f}{b / div:14.3f}{out[label]:>12.2%}")
    for label, a, b in rows:
        allowed = tol * max(b, floor)
        assert abs(a - b) <= allowed, (f"{label}: {names[0]} {a / div:.3f} {unit} vs {names[1]} {b / div:.3f} {unit}, "
                                       f"{abs(a - b) / div:.3f} {unit} apart; at most {tol:.0%} "
                                       f"({allowed / div:.3f} {unit}) allowed")
    return out


STATE_CATEGORIES = ("parameters", "master_weights", "gradients", "optimizer_states")
"""The categories that grow with the parameter count and not with the batch."""


def per_param_at_step(r: Result, device: str, categories=STATE_CATEGORIES + ("comm_buffers", "pinned_overhead")) -> float:
    """Bytes per parameter of `categories` on `device` at the optimizer step: the bytes-per-parameter figure the
    rules of thumb quote (16 B/param for mixed-precision AdamW). Introduced in notebooks/00."""
    per = r.per_param(device, "step")
    return sum(per.get(c, 0) for c in categories)
