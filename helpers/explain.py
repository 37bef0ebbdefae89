"""Explain an out-of-memory error against a model of the run: where it died, what filled the GPU, the way out.

`explain(text, model, setup)` reads what the user pasted (`helpers.oom_messages`), estimates the run on the GPU the
message names (its total capacity), and says:
- the phase it died in: from the traceback's frames, else from the figures (the estimate's first phase over);
- "allocated + tried to allocate" (what PyTorch held, plus what it asked for) against the estimate at that phase;
- which named buffers the requested size is: the estimate's own buffers, one parameter tensor in each dtype, and the
  micro batch's activation-sized tensors (a hidden state, an MLP intermediate, the logits, eager attention's scores),
  each as the caching allocator would ask for it (`helpers.measure.allocator.allocation_size`), matched within the
  message's printed precision, never closer than it prints;
- fragmentation: reserved-but-unallocated memory at least as large as the request (no cached block could hold it),
  and PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True as the cure;
- other processes on the GPU (the message's process lines, or capacity - free - this process's reserved);
- when the run held more than the estimate at that phase beyond the estimate's measured error band, it says so and
  names what the estimate leaves out, instead of forcing a match;
- then the ranked ways out (`helpers.fixes`) at that capacity.

Without a model, the message alone is explained (fragmentation, other processes, the request) and the missing set-up
is named. Evidence kinds: the message's figures are measured (by the user's torch); the estimate is estimated.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from helpers import estimate, models, oom_messages, report, versions
from helpers.errors import InputError
from helpers.estimate import reference
from helpers.measure.allocator import allocation_size, round_size
from helpers.measure.snapshot import OWN_FRAME
from helpers.oom_messages import PHASE_WORDS, CudaOOM, Pasted, Printed
from helpers.results import Result
from helpers.training import TrainSetup, checked
from helpers.units import GiB, MiB, fmt
from helpers.vocab import PHASE_LABELS

# The estimate's phases a traceback's phase compares with: a forward or backward may be the first step's or a later
# one's (the traceback does not say which), so both are read.
ESTIMATE_PHASES = {"load": ("setup",), "setup": ("setup",), "resume": ("resume",), "forward": ("forward", "steady"),
                   "training": ("forward", "backward", "step", "steady"),
                   "backward": ("backward", "steady"), "step": ("step",), "save": ("step",),
                   "steady": ("steady",),                   # (the estimate's own first phase over the capacity)
                   "generation": ("generation",)}           # (a GRPO set-up's; NOT_MODELLED_PHASES otherwise)
LOAD_LABEL = {"load": "model's loading (the estimate's setup)",      # a traceback's phase inside an estimate phase
              "save": "checkpoint save (counted in the estimate's optimizer step)"}
NOT_MODELLED_PHASES = {
    "evaluation": "evaluation runs forward passes (and their logits, often in fp32 and gathered over the eval set by "
                  "eval_accumulation_steps=None) outside the training step this package estimates",
    "generation": "generation (a KV cache, a vLLM engine's gpu_memory_utilization share) is a phase of the "
                  "estimate for GRPO runs only (--run grpo), not of this set-up",
}
# The last torch release that printed each out-of-memory format (helpers.oom_messages.FORMATS): a run whose message
# is in that format ran that release or an older one.
TORCH_OF_FORMAT = {"cached": "1.3.1", "reserved_in_total": "2.0.1", "parenthesised_cut": "2.0.1", "capacty": "2.1.2"}
TWO_OR_MORE = re.compile(r" \+ |\band\b|\bboth\b|\btwo\b|\blists\b")
SMALL_SEGMENTS = (2 * MiB, 20 * MiB)   # allocation_size of any request up to 1 MiB / between 1 and 10 MiB
LEFT_OUT = (
    "tensors kept across steps by the training script (a loss summed without .item(), outputs stored for metrics)",
    "a second model on the same GPU (a reference, reward or teacher model, a vLLM engine)",
    "evaluation or generation between steps",
    "longer sequences than the set-up says (packing, a dataset whose samples exceed max length when truncation is "
    "off)",
    "CUDA graphs' private pools (torch.compile mode='reduce-overhead')",
    "the behaviour of older library releases than those modelled (`estimate` lists the versioned rules it applied)",
)


def left_out(setup: TrainSetup) -> list[str]:
    """LEFT_OUT as it reads for `setup`: a DPO or GRPO set-up counts its reference, a GRPO one its generation and
    a colocated vLLM, so those are not said to be left out."""
    if setup.run in ("sft", "rm"):
        return list(LEFT_OUT)
    second = "a second model on the same GPU (a reward or teacher model" + (
        ")" if setup.run == "grpo" and setup.generation == "vllm-colocate" else ", a vLLM engine)")
    between = "evaluation between steps" if setup.run == "grpo" else LEFT_OUT[2]
    return [LEFT_OUT[0], second, between] + list(LEFT_OUT[3:])


@dataclass(frozen=True)
class Candidate:
    """A buffer the request could be: its name, its bytes, the estimate's phases it lives in, and why."""

    name: str
    bytes: int
    phases: tuple = ()
    why: str = ""

    @property
    def asks(self) -> int:
        """What the caching allocator asks CUDA for when no cached block can hold this tensor: its size rounded to
        512 bytes, then to the segment size (2 MiB up to 1 MiB; 20 MiB up to 10 MiB; 2 MiB multiples above)."""
        return allocation_size(round_size(self.bytes))


@dataclass
class Explanation:
    pasted: Pasted
    lines: list[str] = field(default_factory=list)
    phase: str | None = None
    phase_from: str | None = None            # 'traceback', 'figures' or None
    estimate: Result | None = None
    at_phase: dict = field(default_factory=dict)
    matches: list[Candidate] = field(default_factory=list)
    fragmentation: dict | None = None
    others: dict | None = None
    beyond: dict | None = None
    ways: list = field(default_factory=list)
    preset: str | None = None
    snapshot: dict | None = None
    snapshot_names: list = field(default_factory=list)
    ways_shown: list = field(default_factory=list)   # the names of the ways out the text lists

    def to_json(self) -> dict:
        return {"pasted": self.pasted.to_json(), "phase": self.phase, "phase_from": self.phase_from,
                "gpu_preset": self.preset, "at_phase": self.at_phase,
                "matches": [c.__dict__ | {"asks": c.asks} for c in self.matches],
                "fragmentation": self.fragmentation, "other_processes": self.others, "beyond_estimate": self.beyond,
                "ways": [w.to_json() | {"shown": w.name in self.ways_shown} for w in self.ways],
                "text": self.lines, "snapshot": self.snapshot,
                "snapshot_names": [{"name": n, "blocks": c, "bytes": b} for n, c, b in self.snapshot_names],
                "estimate": None if self.estimate is None else {
                    "phases": self.estimate.gpu.phases, "capacity_bytes": self.estimate.gpu.capacity_bytes,
                    "oom": self.estimate.oom}}

    def text(self) -> str:
        return "\n".join(self.lines)

    def reported_figures(self) -> list[dict]:
        """What the message measured, as figures a memory curve or an explorer marks at its phase: PyTorch's
        allocated bytes plus the request (GiB), at the phase it died in; [] without a placed message."""
        if not self.at_phase:
            return []
        used = self.at_phase["allocated_plus_requested"]
        phase = self.phase if self.phase in self.at_phase["phases"] else None
        return [{"what": "allocated + tried to allocate, from the message", "device": "gpu",
                 "value": round(used / GiB, 2), "unit": "GiB", "read_as": "GiB", "phase": phase,
                 "applies_to": "reported", "why": "torch's out-of-memory message: what PyTorch held and asked for"}]


def presets_for(capacity: Printed | None) -> list[str]:
    """The GPU presets whose capacity as CUDA gives it (the figures quoted in data/published.json come from such
    messages) is the message's 'total capacity' within its printed precision. A capacity does not name a card (an
    A100 80GB and an H100 80GB print nearly the same), so these are only candidates: `explain` uses a preset only
    when the user names one (--gpu)."""
    if capacity is None:
        return []
    from helpers import gpus

    found = []
    for name in gpus.PRESETS:
        p = gpus.preset(name)
        seen = [round(x["gib"] * GiB) for x in p["cuda_total"]] + [p["bytes"]]
        if any(abs(b - capacity.bytes) <= capacity.half_step + 0.005 * GiB for b in seen):
            found.append(name)
    return found


def error_band() -> dict:
    """How far below published peaks estimates of this kind came: the largest under-estimate of a like-with-like
    comparison in data/results/published_vs_ours.json (`python -m helpers.bench published`), and how many runs."""
    path = models.DATA_DIR / "results" / "published_vs_ours.json"
    rows = json.loads(path.read_text())["rows"]
    errs = [v for r in rows for v in (r.get("like_for_like") or {}).values() if isinstance(v, (int, float))]
    return {"under": max(0.0, -min(errs, default=0.0)), "over": max(0.0, max(errs, default=0.0)), "runs": len(rows),
            "source": f"data/results/{path.name}"}


def candidates(model, setup: TrainSetup, r: Result) -> list[Candidate]:
    """Every buffer the estimate names (per GPU), one tensor of each parameter shape in 16-bit and fp32 (and 8-bit
    where states are), and the micro batch's activation-sized tensors."""
    from helpers.estimate import parallel

    m = parallel.rank_model(models.spec(model), setup.tensor_parallel)
    # The estimate's buffers that can be one allocation (an item named for two tensors, 'x + y' or 'x and y', is not): not a sum over every parameter tensor (parameters; and
    # gradients, masters and optimizer states where torch keeps one tensor per parameter: those are the per-tensor
    # candidates below), nor the saved activations (many tensors per layer). ZeRO-1/2 flatten each into one tensor.
    per_tensor = {"parameters", "activations"} | (
        set() if setup.strategy in ("zero1", "zero2") else {"gradients", "master_weights", "optimizer_states"})
    out = [Candidate(i["name"], i["bytes"], tuple(i["phases"]), i["why"]) for i in r.items
           if i["device"] == "gpu" and i["category"] not in per_tensor and not TWO_OR_MORE.search(i["name"])]
    half = 4 if setup.precision == "fp32" else 2
    master = next((i for i in r.items if i["device"] == "gpu" and i["name"].startswith("fp32 master partition")), None)
    if setup.strategy in ("zero1", "zero2") and master is not None:
        out.append(Candidate("one fp32 tensor the size of this GPU's ZeRO partition", master["bytes"],
                             ("step", "steady"),
                             "exp_avg or exp_avg_sq (each its own flat tensor, made at the first step), the fp32 "
                             "gradient partition, or a torch AdamW temporary over the partition "
                             "(exp_avg_sq.sqrt(), ...): ZeRO-1/2 hand the optimizer one flat tensor per group"))
    trained = setup.lora_rank is None
    if setup.strategy in ("zero1", "zero2") and trained:        # a full fine-tune: the flat buffers span the model
        decay = sum(t.numel for t in m.tensors if t.ndim >= 2)      # the Trainer's weight-decay group: not the norms
        out.append(Candidate("DeepSpeed's flat 16-bit buffer of the weight-decay parameter group", decay * 2,
                             ("setup",),
                             "ZeRO-1/2 flatten each parameter group's 16-bit weights into one buffer at "
                             "deepspeed.initialize, one allocation: on the GPU beside the weights when the free "
                             "memory allows, else built on the host and moved in (DeepSpeed 0.19.8 stage_1_and_2.py, "
                             "flatten_on_accelerator, bit16_groups_flat); the HF Trainer's groups are the weights with "
                             "decay and the norms and biases without"))
    shapes: dict[tuple, list[str]] = {}
    for t in m.tensors:
        shapes.setdefault((t.numel, tuple(t.shape)), []).append(re.sub(r"\.\d+\.", ".N.", t.name))
    for name, shape in _experts_as_transformers_4(m).items():
        shapes.setdefault((shape[0] * shape[1], shape), []).append(name)
    for (numel, shape), names in shapes.items():
        distinct = list(dict.fromkeys(names))
        name = " / ".join(distinct[:3]) + (f" (and {len(distinct) - 3} more)" if len(distinct) > 3 else "")
        if any(".experts.N." in n for n in distinct):
            name += " (each expert its own nn.Linear, as transformers 4 built it)"
        dims = "x".join(map(str, shape)) or str(numel)
        out.append(Candidate(f"one {name} [{dims}] in {'fp32' if half == 4 else '16-bit'}", numel * half,
                             ("setup", "forward", "backward", "step", "steady"),
                             ("the weight itself (loading it, gathering it), its gradient, an AdamW state or a "
                              "foreach temporary of the step (pure 16-bit training keeps them in the weights' dtype)"
                              if trained and setup.precision == "bf16" else
                              "the weight itself (loading it, gathering it) or its gradient") if trained else
                             "the frozen weight (loading it, or a 4-bit weight dequantised for its matmul)"))
        if trained and half == 2:
            out.append(Candidate(f"one {name} [{dims}] in fp32", numel * 4, ("step", "steady"),
                                 "an AdamW state (exp_avg or exp_avg_sq, made at the first step), its fp32 master "
                                 "copy or an fp32 gradient"))
        if trained and setup.optimizer == "adamw-8bit":
            out.append(Candidate(f"one {name} [{dims}] in 8-bit", numel, ("step", "steady"),
                                 "a bitsandbytes 8-bit AdamW state"))
    if setup.strategy in ("fsdp1", "fsdp2", "zero3") and trained:
        # FSDP1 flattens each wrapped unit (a decoder layer) into one flat parameter; FSDP2 and ZeRO-3 gather a
        # layer's parameters into one buffer before its forward and backward
        layer = max(n for g, n in m.group_params.items() if g.startswith("layer."))
        for what, nbytes in (("16-bit", 2), ("fp32", 4)):
            out.append(Candidate(f"one decoder layer's parameters as one flat tensor in {what}", layer * nbytes,
                                 ("setup", "forward", "backward", "step", "steady"),
                                 f"{layer:,} parameters: FSDP1's flat parameter of a wrapped layer (and its "
                                 f"gradient, its AdamW states under a torch optimizer), or the layer gathered for "
                                 f"its forward and backward"))
            n = setup.degrees.shard
            if n > 1:
                out.append(Candidate(f"this GPU's shard of one decoder layer's flat parameter in {what}",
                                     -(-layer // n) * nbytes, ("setup", "step", "steady"),
                                     f"1/{n} of {layer:,} parameters (its gradient shard, an AdamW state of it)"))
    seq = setup.seq // setup.context_parallel
    rows = reference.pairs(setup).batch          # (DPO's and a reward model's chosen and rejected in one forward)
    tokens = rows * seq
    acts = [
        ("a hidden state of the micro batch", tokens * m.hidden * half,
         f"batch {rows} x seq {seq} x hidden {m.hidden}: a layer's input, output or a norm's"),
        ("an MLP intermediate of the micro batch", tokens * m.intermediate * half,
         f"batch x seq x intermediate {m.intermediate}: gate or up projection's output"),
        ("the logits of the micro batch", tokens * m.vocab * half, f"batch x seq x vocabulary {m.vocab}"),
        ("the logits of the micro batch in fp32", tokens * m.vocab * 4,
         "the loss's fp32 upcast, log_softmax's output or a gradient of them"),
        ("the shifted logits in fp32", rows * (seq - 1) * m.vocab * 4,
         "older transformers' loss: logits[..., :-1, :].contiguous().float()"),
        ("eager attention's scores of one layer", rows * m.heads * seq * seq * half,
         f"batch x heads {m.heads} x seq x seq (attention without a fused kernel)"),
        ("eager attention's scores of one layer in fp32", rows * m.heads * seq * seq * 4,
         "softmax upcast in fp32"),
    ]
    out += [Candidate(n, b, ("forward", "backward", "steady"), w) for n, b, w in acts
            if b > 0 and not (setup.run == "rm" and setup.rm_head == "score" and "logits" in n)]   # (a score head
    #                                                                    makes no vocabulary logits; a value head does)
    return out


def _experts_as_transformers_4(m) -> dict[str, tuple[int, int]]:
    """One routed expert's weights as transformers 4 stored them, by name: each expert its own nn.Linear (Mixtral's
    experts.N.w1 / w3 [intermediate x hidden] and w2 [hidden x intermediate]; Qwen-MoE's gate_proj / up_proj /
    down_proj), where transformers 5.0 fused them into 3-D parameters (gate_up_proj [experts x 2*intermediate x
    hidden], down_proj [experts x hidden x intermediate]; transformers 4.57 models/mixtral/modeling_mixtral.py
    MixtralBlockSparseTop2MLP against 5.0's MixtralExperts). A message from a run on transformers 4 asks for one of
    these, which no tensor of the transformers 5 model is."""
    old = {}
    for new in ("gate_up_proj", "down_proj"):
        names = [n for n, v in models.PEFT_MOE_NAMES.get(models.PEFT_MOE_PATTERN.get(m.model_type), {}).items()
                 if v == new]
        for t in m.tensors:
            if t.ndim != 3 or not t.name.endswith(f".{new}") or not names:
                continue
            rows = t.shape[1] // 2 if new == "gate_up_proj" else t.shape[1]
            prefix = re.sub(r"\.\d+\.", ".N.", t.name).rsplit(".", 1)[0]
            for n in names:
                old[f"{prefix}.N.{n}.weight"] = (rows, t.shape[2])
    return old


def matching(requested: Printed, cands: list[Candidate], phases: tuple = (), segment: bool = True,
             strict: bool = False) -> list[Candidate]:
    """The candidates whose allocator request is the printed size (within its precision), those alive in `phases`
    first; with `strict` (the phase is known: a traceback's or a snapshot's) only those, where there are any; the same
    name and size once. `segment`: the size is the segment the allocator asked CUDA for (a
    message's 'Tried to allocate'), else the block it looked for (a snapshot's 'oom' entry: round_size only)."""
    found, seen = [], set()
    for c in cands:
        asks = c.asks if segment else round_size(c.bytes)
        if requested.matches(asks) and (c.name, c.bytes) not in seen:
            seen.add((c.name, c.bytes))
            found.append(c)
    alive = [c for c in found if set(c.phases) & set(phases)]
    if strict and alive:
        return alive
    return alive + [c for c in found if c not in alive]


def explain(text: str | None, model=None, setup: TrainSetup | None = None, gpu: str | None = None,
            fixes: bool = True, snapshot=None) -> Explanation:
    """The explanation of a pasted error and/or a memory snapshot (a helpers.snapshots.Snapshot; see the module's
    docstring). `model` and `setup` describe the run (None: the text alone); `gpu` a preset when the message has no
    capacity."""
    if text is None and snapshot is None:
        raise InputError("explain needs the error's text, a memory snapshot, or both")
    pasted = oom_messages.read(text) if text is not None else oom_messages.Pasted()
    ex = Explanation(pasted)
    say = ex.lines.append
    own_phase = None
    if snapshot is not None:
        _say_snapshot(ex, snapshot, model, setup)
        if pasted.oom is None and snapshot.oom is not None:
            pasted.ooms.append(_oom_of_snapshot(snapshot))
            for f in snapshot.oom.get("frames") or []:
                m = re.fullmatch(r"out of memory at the (\w+)", str(f.get("name", "")))
                if f.get("filename") == OWN_FRAME and m:
                    own_phase = m.group(1)
                elif not pasted.frames:
                    pasted.frames.append(oom_messages.Frame(str(f.get("filename", "")), int(f.get("line") or 0),
                                                            str(f.get("name", ""))))
    o = pasted.oom
    if snapshot is not None and o is not None and o.format != "snapshot":
        _cross_check(ex, o, snapshot)
    _say_found(ex, pasted)
    traced = pasted.phase()
    if own_phase in PHASE_LABELS:
        ex.phase, ex.phase_from = own_phase, "snapshot"
        say(f"phase: {PHASE_LABELS[own_phase]} (the snapshot's out-of-memory, written by the allocator model)")
    if traced is not None:
        ex.phase, ex.phase_from = traced[0], "traceback"
        f = traced[1]
        say(f"phase: {PHASE_WORDS[traced[0]]} " + (f"(from the log, line {f.line}: {f.code[:100]!r})"
                                                  if f.file == "<log>" else
                                                  f"(from the traceback: {f.file.rsplit('/', 1)[-1]}:{f.line} in "
                                                  f"{f.function})"))
    if ex.phase is None and pasted.training is not None:
        ex.phase, ex.phase_from = "training", "log"
        say(f"phase: {PHASE_WORDS['training']} (from the log, line {pasted.training[0]}: "
            f"{pasted.training[1][:100]!r}; which part of a step, the log does not say)")
    if o is not None:
        _fragmentation(ex, o)
        _others(ex, o)
    for kind in dict.fromkeys(h.kind for h in pasted.host):        # one line per sign, however often it is logged
        same = [h for h in pasted.host if h.kind == kind]
        more = f"; also line{'s' if len(same) > 2 else ''} {', '.join(str(h.line) for h in same[1:])}" \
            if len(same) > 1 else ""
        say(f"host: {_host_words(same[0])} (line {same[0].line}: {same[0].text[:120]!r}{more})")
    if pasted.host:
        say("  host RAM runs out while loading (each rank converts the whole model into its own memory when it loads "
            "it in a dtype other than the checkpoint's: ranks per node x model size, counted in the estimate's setup), "
            "while a checkpoint is saved (the state dict gathered or cloned on the host: the estimate's optimizer step), or "
            "with optimizer / parameter offload (the estimate's host column)")
    for e in pasted.other_errors:
        kind = "note" if e.kind in ("no_figures", "cut_traceback", "retyped") else "GPU"
        say(f"{kind}: {OTHER_WORDS[e.kind]} (line {e.line}: {e.text[:100]!r})")
    for m in pasted.memory_lines:
        say(f"DeepSpeed see_memory_usage, line {m.line}{' (' + m.label[:60] + ')' if m.label else ''}: allocated "
            f"{m.ma}, max allocated {m.max_ma}, reserved {m.ca}, max reserved {m.max_ca} (DeepSpeed's 'GB' is GiB: "
            f"bytes / 1024**3)")
    for g in pasted.smi:
        procs = [f"PID {pid} {used}" for gpu_, pid, _, used in pasted.smi_processes if gpu_ == g.index]
        say(f"nvidia-smi: GPU {g.index} ({g.name}) {g.used} used of {g.total}"
            + (f"; processes: {', '.join(procs)}" if procs else ""))
    if model is None:
        say("no set-up given: pass --from your config (or --model and flags) to place it against an estimate of "
            "the run, match the requested size to a buffer, and rank the ways out")
        return ex
    setup = checked(TrainSetup() if setup is None else setup)
    ex.preset = gpu
    if gpu is None and o is not None and o.capacity is not None:
        like = presets_for(o.capacity)
        say(f"GPU: {o.capacity} as the message prints it" + (f" (the capacity of {' or '.join(like)}, among others "
                                                              f"possibly" if like else "")
            + ("); " if like else "; ") + "give --gpu NAME for that card's measured CUDA context, else an assumed one")
    if o is not None and o.capacity is not None:
        cap = o.allowed if o.allowed is not None else o.capacity
        setup = setup.replace(gpu_gib=round(cap.bytes / GiB, 3))
    setup = _torch_of_message(ex, setup, o)
    r = estimate.run(model, setup)
    if ex.preset:
        r.meta["gpu_preset"] = ex.preset
    ex.estimate = r
    _place(ex, model, setup, r, o)
    dev = "host" if pasted.host and o is None else "gpu"          # where the run ran out: ways out lower that
    if fixes and (setup.host_gib if dev == "host" else setup.gpu_gib) is not None:
        from helpers import fixes as fixes_module

        try:
            ex.ways = fixes_module.ways_out(model, setup, gpu=ex.preset)
        except InputError as exc:
            say(f"ways out: not ranked ({exc})")
        else:
            where = "per GPU" if dev == "gpu" else "host per node"
            base = r.device(dev).peak_bytes / GiB
            died = [p for p in ESTIMATE_PHASES.get(ex.phase, ()) if p in r.device(dev).phases]

            def at_death(res: Result) -> float:     # the estimate where the run died (its peak where not known)
                d = res.device(dev)
                return max(d.phases[p] for p in died) / GiB if died else d.peak_bytes / GiB

            # fits, lowers the peak, and lowers the phase the run died in, on the device that ran out
            low = fixes_module.LOWERS_GIB
            fitting = [w for w in ex.ways if w.fits and w.result.device(dev).peak_bytes / GiB <= base - low
                       and at_death(w.result) <= at_death(r) - low]
            if dev == "host":                 # more host RAM lowers nothing, yet is a way out where the host ran out
                fitting += [w for w in ex.ways if w.fits and "host_gib" in w.change and w not in fitting]
            ex.ways_shown = [w.name for w in fitting[:5]]
            say(f"ways out (estimated at this capacity, each lowering the peak {where}"
                f"{' and the ' + _label(ex.phase) + ' where the run died' if died else ''}"
                f"{', or adding the host RAM it needs' if dev == 'host' else ''}; `fixes` lists every "
                f"change with its costs):" if fitting else
                f"ways out: no single change, nor any pair of them, both fits this capacity and lowers the peak "
                f"{where} (`fixes` lists what each gives)")
            for w in fitting[:5]:
                change = ", ".join(f"{k}={v}" for k, v in w.change.items() if v is not None)
                held = w.result.device(dev).peak_bytes / GiB
                say(f"  {w.name}: " + (f"the run needs {held:.1f} GiB {where}" if "host_gib" in w.change else
                                        f"{held:.1f} GiB {where}, from {base:.1f}") + (f" ({change})" if change else ""))
    if ex.fragmentation and ex.fragmentation["cause"]:
        enough = ex.fragmentation.get("enough", True)
        say("  expandable_segments:True in the allocator's settings (fragmentation; no change to the set-up)"
            + ("" if enough else ": not enough alone, the estimate needs more than the GPU has"))
    return ex


HOST_WORDS = {
    "oom_killer": "the kernel's OOM killer killed a process: the host ran out of RAM",
    "killed": "'Killed' is bash reporting a SIGKILL, which on a training host is almost always the kernel's OOM "
              "killer (host RAM ran out; `dmesg` shows 'Out of memory: Killed process')",
    "sigkill": "a process ended by signal 9 (SIGKILL; exit code -9, or 137 from a shell), the kernel's OOM killer's "
               "signal when host RAM runs out",
    "memory_error": "Python or C++ could not allocate host memory (MemoryError, std::bad_alloc)",
    "cpu_allocator": "torch's CPU allocator could not allocate host memory",
}
OTHER_WORDS = {
    "cut_traceback": "a traceback cut before its error line: its frames tell the phase; paste the error's last "
                     "lines (from 'CUDA out of memory') for the request and the GPU's figures",
    "no_figures": "an out-of-memory error named without its figures: paste the whole message ('Tried to allocate "
                  "...' and what follows) for the request, the phase and the GPU's figures",
    "retyped": "an out-of-memory message whose figures are not as torch prints them (torch writes '3.91 GiB': two "
               "decimals, a space, a binary unit, never 'GB'): retyped or edited, so they are not read; paste it as "
               "the log printed it",
    "mps": "Apple's MPS backend ran out of memory (its own allocator on unified memory; its 'GB' figures are read as "
           "printed, not placed): this package estimates CUDA GPUs, so the run is not placed against an estimate",
    "cuda_error": "'CUDA error: out of memory' comes from a CUDA call outside PyTorch's caching allocator (creating "
                  "the CUDA context, NCCL's buffers, a library's workspace): the GPU was already full, or another "
                  "process held it",
    "cublas_alloc": "cuBLAS could not allocate its handle or workspace: the GPU was full when a matmul first ran",
    "nccl": "NCCL could not allocate its buffers: the GPU was full when communication started",
}


def _host_words(h) -> str:
    words = HOST_WORDS[h.kind]
    return words + (f" (it asked for {fmt(h.requested.bytes, 2)})" if h.requested is not None else "")


def _oom_of_snapshot(snap) -> CudaOOM:
    """The snapshot's 'oom' trace entry as a message would print it: the request, and what the snapshot held."""
    from helpers import snapshots

    sm = snapshots.summary(snap)
    exact = lambda n: Printed(int(n), 0, fmt(n, 2))          # noqa: E731  (a snapshot's bytes are exact)
    e = snap.oom
    o = CudaOOM("snapshot", "CUDA", exact(e.get("size") or 0), 0, device_index=snap.device)
    o.allocated, o.reserved = exact(sm["allocated"]), exact(sm["reserved"])
    if isinstance(e.get("device_free"), int):
        o.free = exact(e["device_free"])
    return o


def _cross_check(ex: Explanation, o: CudaOOM, snap) -> None:
    """A message and a snapshot given together: from the same out-of-memory when the snapshot's request (its 'oom'
    entry, round_size) asks the message's segment, and its allocated bytes are the message's, both within the
    message's precision; said either way."""
    from helpers import snapshots

    sm = snapshots.summary(snap)
    checks = []
    if snap.oom is not None and snap.oom.get("size"):
        checks.append(("the request", o.requested.matches(allocation_size(round_size(snap.oom["size"])))))
    if o.allocated is not None and not snap.profiler:
        checks.append(("PyTorch's allocated bytes", o.allocated.matches(sm["allocated"])))
    if not checks:
        return
    off = [what for what, ok in checks if not ok]
    ex.lines.append("snapshot and message: " + ("the same out-of-memory (" + " and ".join(w for w, _ in checks)
                                               + " agree to the message's precision)" if not off else
                                               "not the same moment or run: " + " and ".join(off)
                                               + " differ; each is read on its own"))


def _say_snapshot(ex: Explanation, snap, model, setup) -> None:
    from helpers import snapshots

    say = ex.lines.append
    sm = snapshots.summary(snap)
    sm["modelled"] = any(f["filename"] == OWN_FRAME for b in snap.blocks for f in b.frames)
    ex.snapshot = sm
    if snap.profiler:
        say(f"snapshot {snap.path} ({snap.format}): {fmt(sm['allocated'], 2)} allocated in {sm['blocks']} blocks "
            f"[the profiler's tensors; it has no allocator segments, so no reserved or free figure]")
    else:
        say(f"snapshot {snap.path} ({snap.format}; device {snap.device} of {snap.devices}): {sm['segments']} "
            f"segments, {fmt(sm['reserved'], 2)} reserved, {fmt(sm['allocated'], 2)} allocated, "
            f"{fmt(sm['cached_free'], 2)} cached free (largest free block {fmt(sm['largest_free'], 2)})   ["
            + ("modelled: written by this package's allocator model" if sm["modelled"] else
               "the allocator's own bytes") + "]")
    if snap.oom is not None:
        free = snap.oom.get("device_free")
        say(f"  its trace ends in an out-of-memory: {fmt(snap.oom.get('size') or 0, 2)} asked"
            + (f", {fmt(free, 2)} free on the device" if isinstance(free, int) else ""))
    cands = []
    if model is not None:
        try:
            s = checked(TrainSetup() if setup is None else setup)
            cands = candidates(model, s, estimate.run(model, s))
        except InputError:
            cands = []
    rows = snapshots.named(snap, cands)
    ex.snapshot_names = snapshots.by_name(rows)
    how = {r["how"] for r in rows}
    say("  allocated blocks by what they are (" + ", ".join(sorted(how)) + "):")
    for name, count, nbytes in ex.snapshot_names[:8]:
        say(f"    {fmt(nbytes, 2):>11s}  {count:5d} block(s)  {name}")
    if len(ex.snapshot_names) > 8:
        rest = sum(x[2] for x in ex.snapshot_names[8:])
        say(f"    {fmt(rest, 2):>11s}  in {len(ex.snapshot_names) - 8} more kinds")


def _torch_of_message(ex: Explanation, setup: TrainSetup, o: CudaOOM | None) -> TrainSetup:
    """The set-up at the torch release the message's format says, where the user named none: the last release that
    printed that format (the closest to the installed torch's behaviour), said in a line where a torch rule bears on
    the set-up (helpers.versions.RULES)."""
    newest = TORCH_OF_FORMAT.get(o.format) if o is not None else None
    if newest is None or "torch" in versions.parse(setup.versions):
        return setup
    setup = setup.replace(versions=",".join(filter(None, [setup.versions, f"torch={newest}"])))
    ruled = [r for r in versions.applied(setup) if r["library"] == "torch" and r["older"]]
    if ruled:
        ex.lines.append(f"torch: the message is in {oom_messages.FORMATS[o.format].split(':')[0]}'s format, so the "
                        f"estimate takes torch {newest}'s rules, the last release that printed it (--versions "
                        f"torch=X for another): " + "; ".join(r["does"] for r in ruled))
    return setup


def _say_found(ex: Explanation, pasted: Pasted) -> None:
    say = ex.lines.append
    o = pasted.oom
    if o is None:
        return
    ranks = sorted({x.rank for x in pasted.ooms if x.rank is not None})
    more = f" ({len(pasted.ooms)} messages{', ranks ' + ', '.join(map(str, ranks)) if ranks else ''}: the first is read)" \
        if len(pasted.ooms) > 1 else ""
    say(f"message: {o.backend} out of memory, {oom_messages.FORMATS[o.format]}{more}")
    parts = [f"asked for {o.requested}"]
    if o.allocated is not None:
        parts.append(f"{o.allocated} allocated by PyTorch")
    if o.reserved_bytes is not None:
        parts.append(f"{fmt(o.reserved_bytes, 2)} reserved")
    if o.capacity is not None:
        parts.append(f"GPU {o.device_index} of {o.capacity}" + (f" ({o.allowed} allowed to this process)"
                                                                 if o.allowed else "")
                     + (f", {o.free} free" if o.free is not None else ""))
    kind = ("modelled: this package's allocator model" if o.format == "snapshot" and ex.snapshot
            and ex.snapshot.get("modelled") else "measured by the run's torch")
    say("  " + "; ".join(parts) + f"   [{kind}; GiB = 2^30 bytes]")
    cap = o.capacity.bytes if o.capacity is not None else None
    impossible = [what for what, v in (("free", o.free), ("allocated", o.allocated), ("reserved", o.reserved))
                  if cap and v is not None and v.bytes > cap + (o.capacity.half_step + v.half_step)]
    if impossible:
        say(f"  note: these figures cannot all be true ({' and '.join(impossible)} above the GPU's total capacity): "
            f"was the message edited? What follows uses them as printed")
    if o.this_process_without_figure:
        say("  'this process has 0 bytes' (or 2^64 bytes): NVML had no figure for this process, as inside a container")
    if o.requested.bytes in SMALL_SEGMENTS and o.format != "snapshot":
        say(f"  {o.requested} is a segment size, not a tensor's: the allocator asks CUDA for "
            f"{'2 MiB for any request up to 1 MiB' if o.requested.bytes == 2 * MiB else '20 MiB for any request between 1 and 10 MiB'}"
            f", so the request names no buffer; the GPU was full when a small tensor needed room")


def _fragmentation(ex: Explanation, o: CudaOOM) -> None:
    cached = o.cached_free_bytes
    if cached is None:
        return
    cause = cached >= o.requested.bytes
    ex.fragmentation = {"cached_free_bytes": cached, "requested_bytes": o.requested.bytes, "cause": cause}
    var = "PYTORCH_HIP_ALLOC_CONF" if "PYTORCH_HIP_ALLOC_CONF" in o.text or (
        o.backend == "HIP" and "PYTORCH_CUDA_ALLOC_CONF" not in o.text) else "PYTORCH_CUDA_ALLOC_CONF"
    if o.free is not None and o.free.bytes > o.requested.bytes:
        ex.lines.append(f"note: {o.free} was free on the device, more than the {o.requested} asked: the driver "
                        f"itself refused it (another process took the memory meanwhile, a memory fraction, or the driver's "
                        f"own fragmentation), so the figures below may not add up")
    if cause:
        share = f"{cached / o.capacity.bytes:.1%} of the GPU" if o.capacity else "what was cached"
        ex.lines.append(f"fragmentation: {fmt(cached, 2)} was reserved by PyTorch but unallocated, more than the "
                        f"{o.requested} asked, yet no cached block could hold it (the cache is in pieces, or held "
                        f"for another stream): {var}=expandable_segments:True lets segments grow instead of "
                        f"caching pieces (torch 2.1+" + (", newer than this message's torch; before it, "
                                                         "max_split_size_mb" if o.format in ("cached",
                                                         "reserved_in_total", "parenthesised_cut") else "")
                        + f"); curing it frees at most those {fmt(cached, 2)} ({share})")
    elif cached > 0:
        ex.lines.append(f"fragmentation: not the cause ({fmt(cached, 2)} cached but unallocated, less than the "
                        f"{o.requested} asked)")


def _others(ex: Explanation, o: CudaOOM) -> None:
    """What other processes held on the GPU: the message's process lines (torch 2.1+), else what its capacity, free
    memory and this process's reserved bytes leave (the CUDA context is in that remainder too)."""
    if o.capacity is None or o.free is None:
        return
    mine = o.this_process.bytes if o.this_process is not None else None
    listed = [(pid, p) for pid, p in o.processes]
    reserved = o.reserved_bytes
    if mine is None and listed and reserved is not None:
        # without the 'this process' line (torch 2.1 and some later builds) every process on the GPU is listed, this
        # one too: it is the one holding at least what PyTorch reserved (the largest such)
        ours = max((x for x in listed if x[1].bytes + x[1].half_step >= reserved), key=lambda x: x[1].bytes,
                   default=None)
        if ours is not None:
            mine = ours[1].bytes
            listed = [x for x in listed if x is not ours]
    if listed:
        held = sum(p.bytes for _, p in listed)
        ex.others = {"bytes": held, "processes": [{"pid": pid, "bytes": p.bytes} for pid, p in listed],
                     "how": "listed"}
        ex.lines.append(f"other processes on GPU {o.device_index}: {', '.join(f'PID {pid} {p}' for pid, p in listed)} "
                        f"({fmt(held, 2)} in all): memory this run could not use (another rank on the same GPU, "
                        f"a notebook kernel, a vLLM engine)")
        return
    if mine is None and reserved is None:
        return
    if mine is not None and reserved is not None and mine - reserved > 64 * MiB:
        ex.lines.append(f"this process: {fmt(mine, 2)} in use, {fmt(reserved, 2)} of it reserved by PyTorch: "
                        f"{fmt(mine - reserved, 2)} outside PyTorch's allocator (the CUDA context, NCCL and cuBLAS "
                        f"buffers; a colocated vLLM's pools with its sleep mode, which allocates outside it)")
    used_by_us = mine if mine is not None else reserved
    rest = o.capacity.bytes - o.free.bytes - used_by_us
    what = ("outside this process" if mine is not None else
            "outside PyTorch's reserved memory: this process's CUDA context and any other process")
    ex.others = {"bytes": rest, "processes": [],
                 "how": "capacity - free - " + ("this process" if mine is not None else "reserved")}
    if o.processes_without_figure:
        what += (f"; {o.processes_without_figure} process(es) are listed on this GPU with no figure (NVML could not "
                 f"attribute their memory: in a container, every rank placed on GPU {o.device_index} looks so)")
        ex.others["processes_without_figure"] = o.processes_without_figure
    ex.lines.append(f"GPU {o.device_index}: {fmt(max(rest, 0), 2)} in use {what} (capacity {o.capacity} - free "
                    f"{o.free} - {'this process ' + fmt(mine, 2) if mine is not None else fmt(reserved, 2) + ' reserved'})")


def _label(phase: str) -> str:
    """An estimate phase's label, or a traceback's phase in words ('loading the model': part of the estimate's setup)."""
    return PHASE_LABELS.get(phase) or LOAD_LABEL.get(phase) or PHASE_WORDS[phase]


def _setup_words(setup: TrainSetup) -> str:
    """The set-up in words: strategy, world, batch x seq, precision, and every option that is not its default."""
    words = [f"{setup.strategy} on {setup.gpus} GPU(s)", f"batch {setup.batch} x seq {setup.seq}", setup.precision]
    default = TrainSetup()
    for name in ("grad_accum", "lora_rank", "lora_targets", "base_weights", "adapter_dtype", "optimizer", "adam_impl",
                 "checkpointing", "attention", "fused_ce", "kv_expanded", "offload_optimizer", "offload_params",
                 "offload_ratio", "zero3_init", "tensor_parallel", "context_parallel"):
        v = getattr(setup, name)
        if v != getattr(default, name) and v is not None and not (name == "lora_targets" and not setup.lora_rank):
            words.append(f"{name}={v}")
    return ", ".join(words)


def _place(ex: Explanation, model, setup: TrainSetup, r: Result, o: CudaOOM | None) -> None:
    say = ex.lines.append
    phases = r.gpu.phases
    cap = r.gpu.capacity_bytes
    say(f"estimate of the run: {r.model}, " + _setup_words(setup) + (f", on {ex.preset}" if ex.preset else "")
        + "   [estimated]")
    say("  " + ", ".join(f"{PHASE_LABELS[p]} {fmt(b, 2)}" for p, b in phases.items()) + " per GPU (tensors)")
    from helpers import fit

    ok, verdict = fit.fits(r, ex.preset)
    if not cap:
        ok = None                                 # no capacity known: neither 'fits' nor 'does not'
        say(f"  no GPU capacity known (the input names none: give --gpu NAME or --gpu-gib X): {verdict}")
    else:
        say(f"  estimate's verdict at {fmt(cap, 2)}: {verdict}")
    if ex.pasted.host and ex.phase in ("load", "training"):
        hcap = r.host.capacity_bytes
        held = report.loading_bytes(r, "host") if ex.phase == "load" else \
            max(r.host.phases.get(p, 0) for p in ESTIMATE_PHASES["training"])
        saves = ex.phase == "training" and any(i["device"] == "host" for i in r.meta.get("saving") or ())
        say(f"  host {'while the model loads' if ex.phase == 'load' else 'in the training steps'}, estimated: "
            f"{fmt(held, 2)} per node" + (f" of {fmt(hcap, 2)}" if hcap else "")
            + (" (a checkpoint's save counted in the optimizer step: a kill before the first save had less)"
               if saves else "")
            + ("; under the capacity, so the kill is not explained by what the estimate counts there: the ranks' own "
               "processes (interpreter, libraries, data-loader workers), the checkpoint's memory-mapped pages where a "
               "container's memory limit counts them, and other jobs on the node are not counted"
               if hcap and held <= hcap else ""))
    first = r.oom["phase"] or next((p for p, b in phases.items() if cap and b + sum(report.preset_parts(r).values())
                                    > cap), None)
    if ex.phase is None and first:
        ex.phase, ex.phase_from = first, "figures"
        why = ("the traceback's frames name no phase this reads" if ex.pasted.frames else "no traceback")
        say(f"phase: {PHASE_LABELS[first]} ({why}: the estimate's first phase over the capacity"
            + ("" if r.oom["phase"] else ", with the CUDA context") + ")")
    if ex.phase in NOT_MODELLED_PHASES and ex.phase not in phases:
        say(f"  not placed: {NOT_MODELLED_PHASES[ex.phase]}")
    order = ("setup", "forward", "backward", "step")
    if ex.phase_from == "traceback" and first in order and ex.phase in order and first != ex.phase:
        if order.index(first) < order.index(ex.phase):
            say(f"  the run got further than the estimate allows: the estimate runs out at the "
                f"{PHASE_LABELS[first]}, the traceback is at the {_label(ex.phase)}: the set-up given holds "
                f"more than the run did (check the sequence length, micro batch, checkpointing)")
        else:
            say(f"  the run died earlier than the estimate says: the traceback is at the {_label(ex.phase)}, "
                f"the estimate first runs out at the {PHASE_LABELS[first]}")
    compare = ESTIMATE_PHASES.get(ex.phase, ())
    if ex.phase is None:
        compare = tuple(phases)         # no phase known and none over: the run held more than any phase of the estimate?
    if ex.phase == "resume" and "resume" not in phases:
        say("  the set-up has no resume phase: give --resume to estimate loading the optimizer states back")
        compare = ()
    if o is None:
        return
    cands = candidates(model, setup, r)
    ex.matches = matching(o.requested, cands, compare, segment=o.format != "snapshot",
                          strict=ex.phase_from in ("traceback", "snapshot"))
    if o.requested.bytes not in SMALL_SEGMENTS or o.format == "snapshot":
        if ex.matches:
            say(f"the {o.requested} request matches (as the allocator asks for it, within the message's precision):")
            for c in ex.matches[:4]:
                alive = f"; alive in {', '.join(c.phases)}" if c.phases else ""
                asks = c.asks if o.format != "snapshot" else round_size(c.bytes)
                say(f"  {c.name}: {fmt(c.bytes, 2)}, asks {fmt(asks, 2)} ({c.why}{alive})")
            if len(ex.matches) > 4:
                say(f"  ... and {len(ex.matches) - 4} more of that size")
        else:
            say(f"the {o.requested} request matches no buffer of the estimate, no parameter tensor and no "
                f"activation-sized tensor of this set-up: something the estimate does not model asked for it")
    if o.allocated is None or not compare:
        return
    used = o.allocated.bytes + o.requested.bytes
    est = max(phases[p] for p in compare if p in phases)
    room = o.free.bytes if o.free is not None else (o.capacity.bytes - (o.reserved_bytes or o.allocated.bytes)
                                                     if o.capacity is not None else None)
    if room is not None and o.capacity is not None and room >= o.requested.bytes:
        say(f"  the GPU was not full: {fmt(room, 2)} of {o.capacity} was left, more than the {o.requested} asked; "
            f"the request failed for another reason (a per-allocation limit, a memory fraction, memory another "
            f"process took meanwhile), so the comparison below says little")
    band = error_band()
    ex.at_phase = {"phases": list(compare), "estimate_bytes": est, "allocated_plus_requested": used,
                   "ratio": used / est if est else None, "band": band}
    which = max((p for p in compare if p in phases), key=lambda p: phases[p])
    label = ("estimate's peak (the phase is not known)" if ex.phase is None else
             _label(ex.phase) + (f" (compared with the {PHASE_LABELS[which]}, the larger of the first and later "
                                       f"ones: a traceback does not say which iteration)" if len(compare) > 1 else ""))
    say(f"at the {label}: the run held {o.allocated} and asked for {o.requested} ({fmt(used, 2)}); the estimate "
        f"puts {fmt(est, 2)} of tensors there" + (f" ({used / est:.0%} of it)" if est else ""))
    if est and used > est * (1 + band["under"]):
        gap = used - est
        ex.beyond = {"bytes": gap, "left_out": left_out(setup)}
        say(f"  the run held and asked for {fmt(gap, 2)} more than the estimate, beyond its error band (estimates came within "
            f"{band['under']:.0%} below published peaks on {band['runs']} runs, {band['source']}): the run used more "
            f"than is modelled. The estimate leaves out:")
        for x in ex.beyond["left_out"]:
            say(f"    - {x}")
        if ok:
            say("  so its 'fits' was wrong for this run: check the set-up given matches the run (sequence length, "
                "micro batch, precision, LoRA, the number of GPUs)")
    elif ok is None:
        say("  the run held less than the estimate's figure there: consistent with it")
    elif ok:
        why = []
        if ex.fragmentation and ex.fragmentation["cause"]:
            why.append(f"fragmentation ({fmt(ex.fragmentation['cached_free_bytes'], 2)} cached in pieces)")
        if ex.others and ex.others["bytes"] > 0.02 * (cap or 0):
            why.append(f"memory outside this run's tensors ({fmt(ex.others['bytes'], 2)}, above)")
        say(("  the run died below the estimate's figure there" if used < est else
             f"  the run held what the estimate puts there ({used / est:.0%} of it, within its error band)")
            + ", and the estimate says the set-up fits: "
            + ("; ".join(why) + " explain(s) the difference" if why else
               "neither fragmentation nor other processes account for it: the set-up given is likely not the "
               "run's (sequence length, micro batch, precision), or the run held tensors the estimate does not"))
    elif used < est and cap and est > 2 * cap:
        say(f"  consistent, both say it does not fit: the estimate needs {fmt(est, 2)} here, {est / cap:.1f} times the GPU's "
            f"{fmt(cap, 2)}, and the run died holding {fmt(used, 2)}. If the run got further than this phase, the "
            f"set-up given is not the run's (check the sequence length, checkpointing, LoRA, the strategy and the "
            f"number of GPUs)")
    elif used < est:
        say("  consistent: the run died on its way to the estimate's figure, which does not fit this GPU")
    else:
        say(f"  consistent: the run held what the estimate puts there, within its error band (estimates came within "
            f"{band['under']:.0%} below published peaks on {band['runs']} runs), and that does not fit this GPU")
    if ex.fragmentation and ex.fragmentation["cause"] and cap and ex.beyond is None:
        short = max(phases[p] for p in compare if p in phases) + sum(report.preset_parts(r).values()) - cap
        ex.fragmentation["enough"] = short <= 0
        say("  fragmentation alone: " + ("curing it may let the run fit (the estimate's tensors and the CUDA "
                                         "context fit the capacity at this phase)" if short <= 0 else
                                         f"curing it would not be enough: the estimate needs {fmt(short, 2)} more "
                                         f"than the GPU has at this phase"))
