"""Ways out of an out-of-memory: every single change a user could make to a set-up, its new peak, whether it fits,
and what it costs (host RAM, pinned RAM, step time where that can be computed), ranked.

`ways_out(model, setup)` tries each change on its own (and, where none fits the same GPUs, every pair of them) (checkpointing full or selective, a fused cross-entropy, a
smaller micro batch with more accumulation, a higher ZeRO stage or FSDP2, optimizer / parameter offload, the
smallest offload ratio that fits, pin_memory off, 8-bit AdamW, LoRA, the fewest GPUs that fit, flash attention).
Which changes exist for a strategy is decided by `TrainSetup.validate` and the registry (`helpers.strategies`): a
change they refuse is skipped (listed in `skipped` with the reason), never a crash. The verdict is `helpers.fit.fits`,
the report's. Costs: host and pinned GiB from the estimate's host figures; step seconds from `helpers.step_cost`
(recomputed FLOPs, PCIe bytes, host Adam, each at a stated rate with its source), or None where the change is not
a matter of time (LoRA and 8-bit AdamW change what or how it trains, more GPUs cost money, a strategy change
moves communication this package does not time): `cost_basis` says which. Ranked: fits first, then those that lower
the peak (by at least LOWERS_GIB) before those that do not (a set-up that fits as given: a faster change may hold
more), then those with a time by the time added, then by host RAM added.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from packaging.version import Version

from helpers import estimate, fit, models, step_cost, strategies, versions
from helpers.errors import InputError
from helpers.results import Result
from helpers.training import FACES, MAX_GRAD_ACCUM, TrainSetup, checked
from helpers.units import GiB, to_gib

LORA_RANK = 8                 # peft's LoraConfig default r (peft src/peft/tuners/lora/config.py, `r: int = 8`)
RATIOS = tuple(round(0.05 * i, 2) for i in range(1, 20))     # offload ratios tried, 0.05 to 0.95
MAX_GPUS_TRIED = 4096


@dataclass
class WayOut:
    """One change and its outcome: `change` (TrainSetup fields), the changed `setup` and its estimate `result`; peak
    per GPU in GiB; `fits` by the report's verdict; host and pinned GiB added per node; step seconds added (None
    where not a matter of time, `cost_basis` says why) and how the cost was computed."""

    name: str
    change: dict
    setup: TrainSetup
    result: Result
    peak_gib: float
    fits: bool
    host_gib_added: float
    pinned_gib_added: float
    step_seconds_added: float | None
    cost_basis: str
    verdict: str = ""

    def to_json(self) -> dict:
        return {"name": self.name, "change": self.change, "peak_gib": self.peak_gib, "fits": self.fits,
                "host_gib_added": self.host_gib_added, "pinned_gib_added": self.pinned_gib_added,
                "step_seconds_added": self.step_seconds_added, "cost_basis": self.cost_basis, "verdict": self.verdict}


def pinned_bytes(r: Result) -> int:
    """Page-locked host bytes at the host's peak phase: pinned buffers and the pinned allocator's rounding."""
    if not isinstance(r, Result):
        raise InputError(f"pinned_bytes needs a helpers.results.Result, got {type(r).__name__}")
    phase = r.host.peak_phase
    return sum(i["bytes"] for i in r.items if i["device"] == "host" and phase in i["phases"]
               and (i.get("pinned") or i["category"] == "pinned_overhead"))


NO_TIME = {name: f.no_time for name, f in FACES.items() if f.no_time}
"""Fields whose change is a different run, not a slower one: no seconds are priced (their Face says why)."""


def _with_restated(change: dict, setup: TrainSetup, new: TrainSetup) -> dict:
    """`change` and every other field the change restated (TrainSetup.changed: the Trainer's adam_impl dropped where
    offload makes accelerate swap in DeepSpeed's CPU Adam), so a way out says all it changes."""
    moved = {f.name: getattr(new, f.name) for f in dataclasses.fields(new)
             if f.name not in change and getattr(new, f.name) != getattr(setup, f.name)}
    return change | moved


def _candidates(m, s: TrainSetup) -> list[tuple[str, dict]]:
    """(name, change) for each single change that is not already in effect; validity is checked by the caller."""
    st = s.strat
    out = []
    if s.checkpointing != "full":
        out.append(("checkpointing full", {"checkpointing": "full"}))
    elif s.checkpoint_every > 1:
        out.append(("checkpointing every layer", {"checkpoint_every": 1}))
    if s.checkpointing != "selective":
        out.append(("checkpointing selective", {"checkpointing": "selective", "checkpoint_every": 1}))
    for name, f in FACES.items():                        # the single-valued ways out their fields name
        if f.remedy is not None and getattr(s, name) != f.remedy[1]:
            out.append((f.remedy[0], {name: f.remedy[1]}))
    for name in strategies.names(lambda x: set(x.shards) > set(st.shards)):    # shards more (on one GPU too)
        change = {"strategy": name}
        if not strategies.get(name).torch_optimizer and s.adam_impl is not None:
            change["adam_impl"] = None
        if not strategies.get(name).deepspeed and s.load_dtype is not None:    # a torch engine loads in its own dtype
            change["load_dtype"] = None
        out.append((f"strategy {name}", change))
    both = st.offload_together
    if "offload_optimizer" in st.offload and not s.offload_optimizer:
        change = {"offload_optimizer": True} | ({"offload_params": True} if both else {})
        if not st.torch_optimizer and (s.adam_impl is not None or s.optimizer == "adamw-8bit"):
            change |= {"adam_impl": None} | ({"optimizer": "adamw"} if s.optimizer == "adamw-8bit" else {})
            # (accelerate swaps DeepSpeedCPUAdam in for the Trainer's optimizer: TrainSetup.validate says so)
        out.append(("optimizer offload", change))
    if "offload_params" in st.offload and not s.offload_params and not both:
        out.append(("parameter offload", {"offload_params": True}))
    if s.pin_memory and (s.offload_optimizer or s.offload_params):
        out.append(("pin_memory off", {"pin_memory": False}))
    if s.optimizer != "adamw-8bit":
        out.append(("8-bit AdamW", {"optimizer": "adamw-8bit", "adam_impl": None}))
    old: dict[str, str] = {}
    for r in versions.applied(s):
        if r["older"] and r["from"] == "given":
            old[r["library"]] = max(old.get(r["library"], r["changed_in"]), r["changed_in"], key=Version)
    if old:
        out.append((", ".join(f"{lib} {rel} or later" for lib, rel in sorted(old.items())) + " (upgrade)",
                    {"versions": None}))
    if s.lora_rank is None:
        out.append((f"LoRA rank {LORA_RANK}", {"lora_rank": LORA_RANK}))
    elif not s.quantized:
        if s.base_fp32:
            out.append((f"{s.half} LoRA base (dtype {'bfloat16' if s.half == 'bf16' else 'float16'})",
                        {"base_weights": None}))
        out.append(("QLoRA: 4-bit (nf4) base", {"base_weights": "nf4"}))
    return out


def ways_out(model, setup: TrainSetup, gpu: str | None = None, skipped: list | None = None) -> list[WayOut]:
    """Every single change of `setup` with its estimate, verdict and cost, ranked (see the module's docstring).
    `gpu`: a helpers.gpus preset (the CUDA context and NCCL count in the verdict). `skipped`, when given, receives
    (name, reason) for each change the set-up's strategy does not allow."""
    setup = checked(setup)
    fit.needs_capacity(setup, "fixes")
    if skipped is not None and not isinstance(skipped, list):
        raise InputError(f"skipped must be a list (it receives the changes not allowed, with why), got "
                         f"{type(skipped).__name__}")
    skipped = [] if skipped is None else skipped
    base = estimate.run(model, setup)
    ways: list[WayOut] = []

    def attempt(name: str, change: dict) -> WayOut | None:
        try:
            new = setup.changed(**change)
            r = estimate.run(model, new)
        except InputError as exc:
            skipped.append((name, str(exc)))
            return None
        if r.gpu.phases == base.gpu.phases and r.host.phases == base.host.phases:
            skipped.append((name, "it changes no figure of this set-up"))
            return None
        return _way(model, name, _with_restated(change, setup, new), setup, base, new, r, gpu)

    def add(w: WayOut | None) -> None:
        if w is not None:
            ways.append(w)

    for name, change in _candidates(model, setup):
        add(attempt(name, change))
    add(_smaller_batch(model, setup, base, gpu, skipped))
    add(_offload_ratio(model, setup, base, gpu, skipped))
    add(_more_gpus(model, setup, base, gpu, skipped))
    for w in _host_ways(model, setup, base, gpu, skipped):
        add(w)
    if not any(w.fits for w in ways if not w.name.startswith(("more GPUs", "fewer GPUs per node", "more host RAM"))):
        ways += _pairs(model, setup, base, gpu)       # no single change on these GPUs fits: the cheapest pairs
    ways.sort(key=lambda w: (not w.fits, not lowers(base, w.result), w.step_seconds_added is None,
                             w.step_seconds_added or 0.0, w.host_gib_added))
    return ways


def failing_device(r: Result) -> str:
    """The device whose capacity a result does not fit ('gpu' or 'host'); 'gpu' when it fits (the GPU's peak is
    what a change is judged by then)."""
    return r.oom["device"] or "gpu"


def lowers(base: Result, r: Result) -> bool:
    """Whether `r` holds less than `base` (by at least LOWERS_GIB) on the device where `base` runs out, at its
    peak: the host's where the host runs out (loading, offload), else the GPU's."""
    dev = failing_device(base)
    return to_gib(r.device(dev).peak_bytes) <= to_gib(base.device(dev).peak_bytes) - LOWERS_GIB


PAIRS_KEPT = 5
LOWERS_GIB = 0.05          # a change lowers the peak when by at least this much (GiB): less is the estimate's rounding


def _pairs(model, setup: TrainSetup, base: Result, gpu) -> list[WayOut]:
    """Where no single change fits on the same GPUs: every pair of single changes (and micro batch 1 with the
    accumulation that keeps the global batch) that the set-up allows, estimated; the PAIRS_KEPT cheapest that fit,
    by the same ranking as the single ones."""
    singles = list(_candidates(model, setup))
    if setup.batch > 1 and setup.grad_accum * setup.batch <= MAX_GRAD_ACCUM:
        singles.append(("micro batch 1, more accumulation", {"batch": 1, "grad_accum": setup.grad_accum * setup.batch}))
    found = []
    for i, (name_a, a) in enumerate(singles):
        for name_b, b in singles[i + 1:]:
            if set(a) & set(b):
                continue                            # two values of one setting: not a pair
            change = a | b
            try:
                new = setup.changed(**change)
                r = estimate.run(model, new)
            except InputError:
                continue
            if fit.fits(r, gpu)[0]:
                found.append(_way(model, f"{name_a} + {name_b}", _with_restated(change, setup, new), setup, base,
                                  new, r, gpu))
    found.sort(key=lambda w: (w.step_seconds_added is None, w.step_seconds_added or 0.0, w.host_gib_added))
    return found[:PAIRS_KEPT]


def _way(model, name, change, before, base, after, r, gpu) -> WayOut:
    ok, line = fit.fits(r, gpu)
    untimed = [NO_TIME[k] for k in change if k in NO_TIME and change[k] != getattr(before, k)]
    if untimed:
        seconds, basis = None, "not a matter of step time: " + "; ".join(untimed)
    else:
        seconds, basis = step_cost.added(model, before, after)
    return WayOut(name, dict(change), after, r, round(to_gib(r.gpu.peak_bytes), 3), ok,
                  round(to_gib(r.host.peak_bytes - base.host.peak_bytes), 3),
                  round(to_gib(pinned_bytes(r) - pinned_bytes(base)), 3), seconds, basis, line)


def _first_fitting(model, setup, changes, gpu):
    """The first change of `changes` whose estimate fits, else the last one tried: (change, setup, result) or None
    when none is valid."""
    last = None
    for change in changes:
        try:
            new = setup.changed(**change)
        except InputError:
            continue
        r = estimate.run(model, new)
        last = (_with_restated(change, setup, new), new, r)
        if fit.fits(r, gpu)[0]:
            break
    return last


def _smaller_batch(model, setup, base, gpu, skipped):
    """A smaller micro batch (a divisor of it, the largest that fits) with the accumulation that keeps the global
    batch: batch x grad_accum unchanged."""
    name = "smaller micro batch, more accumulation"
    if setup.batch == 1:
        skipped.append((name, "micro batch is 1 already"))
        return None
    changes = [{"batch": b, "grad_accum": setup.grad_accum * setup.batch // b}
               for b in range(setup.batch - 1, 0, -1) if setup.batch % b == 0
               and setup.grad_accum * setup.batch // b <= MAX_GRAD_ACCUM]
    got = _first_fitting(model, setup, changes, gpu)
    if got is None:
        skipped.append((name, f"no divisor of batch {setup.batch} keeps grad_accum within {MAX_GRAD_ACCUM}"))
        return None
    return _way(model, name, got[0], setup, base, got[1], got[2], gpu)


def _offload_ratio(model, setup, base, gpu, skipped):
    """The smallest partial optimizer offload (DeepSpeed's ratio, ZeRO-3) that fits, from 0.05 up in steps of 0.05:
    less than a full offload where the host is what runs out (cases 2 and 3), more than none where the GPU does."""
    name = "offload ratio (smallest that fits)"
    if "offload_ratio" not in setup.strat.offload:
        skipped.append((name, f"offload_ratio is honoured by {strategies.listing(lambda x: 'offload_ratio' in x.offload)}"
                              f" only, not {setup.strategy!r}"))
        return None
    m = models.spec(model)
    try:                             # the smallest ratio of each split DeepSpeed can make; none that is the current one
        split = lambda r: step_cost.host_sub_groups(m, setup.replace(offload_optimizer=True, offload_ratio=r))[1]
        changes, seen = [], {split(setup.ratio) if setup.offload_optimizer else None}
        for r in RATIOS:
            first = split(r)
            if first not in seen:
                seen.add(first)
                changes.append({"offload_optimizer": True, "offload_ratio": r})
    except InputError:               # a set-up that takes no ratio: said below
        changes = [{"offload_optimizer": True, "offload_ratio": r} for r in RATIOS]
    got = _first_fitting(model, setup, changes, gpu)
    if got is None:                  # every ratio refused by the set-up (e.g. the Trainer's own optimizer under ZeRO)
        try:
            setup.replace(offload_optimizer=True, offload_ratio=RATIOS[0])
        except InputError as e:
            skipped.append((name, str(e)))
            return None
        skipped.append((name, "no offload ratio is valid with this set-up"))
        return None
    return _way(model, f"offload ratio {got[0]['offload_ratio']}", got[0], setup, base, got[1], got[2], gpu)


def _more_gpus(model, setup, base, gpu, skipped):
    """The fewest GPUs (world size) that fit, by doubling then halving the gap (memory per GPU falls with the world
    size only where the strategy shards)."""
    name = "more GPUs"
    if not setup.strat.multi_gpu or not setup.strat.shards:
        skipped.append((name, f"strategy {setup.strategy!r} {'runs on one GPU' if not setup.strat.multi_gpu else 'replicates every state: more GPUs do not lower the memory per GPU'}"))
        return None

    # world sizes in whole model-parallel groups where the set-up has them (issue 14's tensor/context parallel)
    unit = setup.degrees.model_parallel

    def at(k):
        new = setup.replace(gpus=k * unit)
        r = estimate.run(model, new)
        return new, r, fit.fits(r, gpu)[0]

    most = MAX_GPUS_TRIED // unit
    start = setup.gpus // unit
    if start >= most:
        skipped.append((name, f"the run already has {setup.gpus} GPUs; more GPUs are tried up to {MAX_GPUS_TRIED}"))
        return None
    seen = {}

    def fails(k):                                      # the current world size does not fit; more may
        seen[k] = at(k)
        return not seen[k][2]

    try:
        _, hi = fit.boundary(fails, start, most)
        if hi is None:
            new, r, _ = seen[most]
            return _way(model, f"more GPUs ({most * unit}: none up to it fits)", {"gpus": most * unit}, setup, base,
                        new, r, gpu)
    except InputError as exc:
        skipped.append((name, str(exc)))
        return None
    new, r, _ = seen[hi]
    return _way(model, f"more GPUs ({hi * unit})", {"gpus": hi * unit}, setup, base, new, r, gpu)


def _host_ways(model, setup, base, gpu, skipped) -> list[WayOut]:
    """Where the host runs out (ranks per node x the loading copy, offloaded states): fewer GPUs per node (the
    most that fit among the divisors of the world size: the same world size on more nodes, each full; host RAM is
    per node), offload turned off where the set-up offloads, and the host RAM per node the estimate needs. Changes
    of hardware: no step time is priced. [] where the host fits."""
    if failing_device(base) != "host":
        for name in ("fewer GPUs per node", "more host RAM"):
            skipped.append((name, "the host fits as given"))
        return []
    out = []
    per_node = setup.ranks_per_node
    changes = [{"gpus_per_node": k} for k in range(per_node - 1, 0, -1) if setup.gpus % k == 0]   # whole nodes
    got = _first_fitting(model, setup, changes, gpu) if changes else None
    if got is None:
        skipped.append(("fewer GPUs per node", "one GPU per node already"))
    else:
        k = got[0]["gpus_per_node"]
        nodes = -(-setup.gpus // k)
        out.append(_way(model, f"fewer GPUs per node ({k} per node, {nodes} nodes)", got[0], setup, base, got[1],
                        got[2], gpu))
    off = {k: False for k in ("offload_optimizer", "offload_params") if getattr(setup, k)}
    if off:                                     # the offloaded states back on the GPUs: the host holds them no more
        try:
            new = setup.replace(**off)
            out.append(_way(model, "offload off (the states back on the GPUs)", off, setup, base, new,
                            estimate.run(model, new), gpu))
        except InputError as exc:
            skipped.append(("offload off", str(exc)))
    need = -(-base.host.peak_bytes // GiB)                           # whole GiB, rounded up
    try:
        new = setup.replace(host_gib=float(need))
    except InputError as exc:
        skipped.append(("more host RAM", str(exc)))
        return out
    out.append(_way(model, f"more host RAM ({need} GiB per node)", {"host_gib": float(need)}, setup, base, new,
                    estimate.run(model, new), gpu))
    return out


def table(ways: list[WayOut]) -> str:
    """The ranked ways out as text: peak per GPU, fits, host and pinned GiB added per node, seconds added per step
    (GiB = 2^30 bytes), each with its cost basis on the next line."""
    if not isinstance(ways, (list, tuple)) or not all(isinstance(w, WayOut) for w in ways):
        raise InputError(f"table needs the list of WayOut that fixes.ways_out returns, got {type(ways).__name__}")
    wide = min(64, max([38] + [len(w.name) for w in ways]))        # the longest name, whole (up to 64)
    lines = [f"{'#':>2s}  {'change':{wide}s}{'peak GiB':>9s}  {'fits':5s}{'+host GiB':>10s}{'+pinned':>9s}"
             f"{'+s/step':>9s}"]
    for n, w in enumerate(ways, 1):
        secs = "-" if w.step_seconds_added is None else f"{w.step_seconds_added:.3f}"
        change = ", ".join(f"{k}={v}" if v is not None else "the installed releases" if k == "versions" else
                           f"{k} unset" for k, v in w.change.items())
        lines.append(f"{n:2d}  {w.name[:wide]:{wide}s}{w.peak_gib:9.2f}  {'yes' if w.fits else 'no':5s}"
                     f"{w.host_gib_added:10.2f}{w.pinned_gib_added:9.2f}{secs:>9s}")
        lines.append(f"    {change}; cost: {w.cost_basis}")
    return "\n".join(lines)
