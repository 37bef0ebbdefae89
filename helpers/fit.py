"""The largest micro batch or the longest sequence that fits a capacity, found by search over the estimate.

`largest(model, setup, "batch")` answers the reader's second question without a GPU: the largest micro batch per GPU
(or, with "seq", the longest sequence) whose estimate fits `setup.gpu_gib` per GPU and `setup.host_gib` per node.
The verdict is the one the report prints (`fits`, below): no phase of either device over its capacity
(`Result.oom`), and where a `--gpu` preset names the GPU, also the device total of the tensors plus its CUDA context
and NCCL's buffers (`helpers.gpus.pushed_over`, the rule `helpers.measure.dryrun.recheck` applies to an estimate).

The search doubles from the smallest value until a value does not fit, then halves the gap (memory grows with batch
and with sequence: activations and logits are linear in tokens, attention's eager scores quadratic in seq): about
2 log2(answer) estimates, each a few ms (`python -m helpers.bench fit` prints both). The answer is checked: it fits
and the next value (one more sequence, or one more sequence step) does not; `Fit` keeps both results.

Sequence lengths move in steps of SEQ_STEP = 64 tokens: the lengths real configs use are multiples of 64 (512, 2048,
4096, 8192: the cases in data/cases.json, torchtitan's and LLaMA-Factory's examples), and a finer answer would claim a
precision the estimate (within ~3% of the dry run, data/results/dryrun_vs_estimate.json) does not have; 64 tokens
of a 4096-token sequence is 1.6%. Batch moves in whole sequences.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from helpers import estimate, gpus
from helpers.errors import InputError
from helpers.results import Result
from helpers.training import MAX_TOKENS, TrainSetup, checked
from helpers.units import to_gib
from helpers.vocab import PHASE_LABELS

VARY = ("batch", "seq")
SEQ_STEP = 64


@dataclass
class Fit:
    """The answer: `value` (0 when even the smallest does not fit), its estimate `result`, and the next value up
    with its estimate (None at the limit batch x seq <= MAX_TOKENS)."""

    vary: str
    value: int
    result: Result | None
    next_value: int | None
    next_result: Result | None
    step: int = 1
    """The granularity searched: 1 sequence for batch, SEQ_STEP tokens for seq."""
    estimates: int = 0
    """How many estimates the search ran."""
    seconds: float = 0.0
    """Wall time of the search."""
    why: str = ""
    """What stops the next value: its verdict, or the token limit; with value 0, what is too big at the smallest."""
    setup: TrainSetup | None = None
    """The set-up with the answer in place (None when value is 0)."""
    limits: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        res = lambda r: None if r is None else {"gpu_peak_bytes": r.gpu.peak_bytes, "host_peak_bytes": r.host.peak_bytes,
                                                 "oom": r.oom}
        return {"vary": self.vary, "value": self.value, "step": self.step, "next_value": self.next_value,
                "result": res(self.result), "next_result": res(self.next_result), "estimates": self.estimates,
                "seconds": self.seconds, "why": self.why, "limits": self.limits}

    def line(self) -> str:
        """One line: 'largest micro batch that fits: 6 (7 does not: OOM on GPU at ...)'."""
        what = "micro batch" if self.vary == "batch" else "sequence"
        if self.value == 0:
            return f"no {what} fits: {self.why}"
        return (f"largest {what} that fits: {self.value}"
                + (f" tokens (multiples of {self.step})" if self.vary == "seq" else "")
                + f"; {self.next_value if self.next_value is not None else 'the next'} does not: {self.why}"
                + f"   [{self.estimates} estimates, {self.seconds * 1000:.0f} ms]")


def _result(result, what: str) -> None:
    if not isinstance(result, Result):
        raise InputError(f"{what} needs a helpers.results.Result (from estimate.run or a dry run), got "
                         f"{type(result).__name__}")


def _found(found, what: str) -> None:
    if not isinstance(found, dict) or not all(isinstance(f, Fit) for f in found.values()):
        raise InputError(f"{what} needs the {{vary: Fit}} dict that fit.largest returns, got {type(found).__name__}")


def fits(result: Result, gpu: str | None = None) -> tuple[bool, str]:
    """(fits, the verdict line): the report's verdict (no phase over its device's capacity), and with a GPU preset
    also the device total (tensors + CUDA context + NCCL buffers) within the GPU's capacity."""
    from helpers import report

    _result(result, "fits")

    if result.oom["device"] is not None:
        return False, report.verdict(result)
    saved = result.meta.get("gpu_preset")
    if gpu is not None:                        # for this call only: the result keeps the preset it was made with
        result.meta["gpu_preset"] = gpu
    try:
        total = report.device_total_oom(result)
    finally:
        if saved is None:
            result.meta.pop("gpu_preset", None)
        else:
            result.meta["gpu_preset"] = saved
    return (False, total) if total else (True, report.verdict(result))


def too_big(result: Result) -> str:
    """What does not fit: the verdict and the largest category at that device's failing phase, in GiB."""
    from helpers import report

    _result(result, "too_big")
    dev = result.oom["device"] or "gpu"
    d = result.device(dev)
    phase = result.oom["phase"] or d.peak_phase
    cats = sorted(d.breakdown[phase].items(), key=lambda kv: -kv[1])[:2]
    return (report.verdict(result) + "; largest there: "
            + ", ".join(f"{c} {to_gib(v):.1f} GiB" for c, v in cats if v) + f" ({dev}, {PHASE_LABELS[phase]})")


def boundary(holds, lo: int, most: int) -> tuple[int, int | None]:
    """Where a monotone test stops holding: `holds(lo)` is known to be True, and once False it stays False above.
    Doubling from `lo` (capped at `most`), then bisecting the gap: (the largest k that holds, the smallest that does
    not, or None when every k up to `most` holds). `fit.largest` and `fixes`' "more GPUs" both search this way."""
    if not callable(holds):
        raise InputError(f"boundary needs a test to call on each k, got {type(holds).__name__}")
    for name, v in (("lo", lo), ("most", most)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"boundary's {name} must be a positive integer, got {v!r}")
    hi, k = None, lo
    while hi is None and k < most:
        k = min(k * 2, most)
        if holds(k):
            lo = k
        else:
            hi = k
    while hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        if holds(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


def needs_capacity(setup: TrainSetup, what: str) -> None:
    """InputError unless the set-up has a GPU or host capacity to fit into (`what`: the command asking)."""
    if setup.gpu_gib is None and setup.host_gib is None:
        raise InputError(f"{what} needs a capacity to fit into: give gpu_gib (--gpu-gib X or --gpu NAME) and/or "
                         f"host_gib (--host-gib Y), got neither")


def largest(model, setup: TrainSetup, vary: str = "batch", gpu: str | None = None) -> Fit:
    """The largest micro batch (vary='batch') or sequence (vary='seq', multiples of SEQ_STEP) whose estimate fits
    the set-up's capacities; `gpu` (a helpers.gpus preset) adds the CUDA context and NCCL to the GPU's total.
    InputError for an unknown `vary`, a set-up with no capacity, or a bad set-up."""
    if vary not in VARY:
        raise InputError(f"vary must be one of {', '.join(VARY)}, got {vary!r}")
    setup = checked(setup)
    needs_capacity(setup, "fit")
    if gpu is not None:
        gpus.preset(gpu)
    started = time.perf_counter()
    # a sequence in steps of 64 tokens, and of 2 x cp under context parallelism (each rank's load-balanced halves)
    step = 1 if vary == "batch" else math.lcm(SEQ_STEP, 2 * setup.context_parallel)
    other = setup.seq if vary == "batch" else setup.batch
    most = (MAX_TOKENS // other) // step               # the limit, in steps (batch x seq <= MAX_TOKENS)
    limits = {"max_tokens": MAX_TOKENS, "most": most * step}
    if most < 1:
        raise InputError(f"{'seq' if vary == 'batch' else 'batch'} {other} leaves no room for even one "
                         f"{'sequence' if vary == 'batch' else f'{step}-token step'} under {MAX_TOKENS:,} tokens")
    cache: dict[int, tuple[Result, bool, str]] = {}

    # OpenRLHF's actor makes every position's logits: its sequence (prompt + generated) is searched whole, the
    # completion (the loss's per-token vectors alone) kept within it
    whole = vary == "seq" and setup.dpo_logps == "openrlhf" and setup.completion is not None

    def changed(k: int) -> dict:
        return {vary: k * step, **({"completion": min(setup.completion, k * step - 1)} if whole else {})}

    def at(k: int) -> tuple[Result, bool, str]:
        if k not in cache:
            r = estimate.run(model, setup.replace(**changed(k)))
            cache[k] = (r, *fits(r, gpu))
        return cache[k]

    low = 1                                            # GRPO: a sequence longer than its completion, the least
    if vary == "seq" and setup.run == "grpo" and setup.completion is not None and not whole:
        low = setup.completion // step + 1
    first = at(low)
    if not first[1]:
        return Fit(vary, 0, None, low * step, first[0], step, len(cache), time.perf_counter() - started,
                   f"at {vary} {low * step}: {too_big(first[0])}", None, limits)
    lo, hi = boundary(lambda k: at(k)[1], low, most)   # lo fits; hi (when known) does not
    if hi is None:                                     # everything up to the token limit fits
        value_r = at(lo)[0]
        return Fit(vary, lo * step, value_r, None, None, step, len(cache), time.perf_counter() - started,
                   f"the limit: batch x seq at most {MAX_TOKENS:,} tokens per micro batch (TrainSetup.MAX_TOKENS)",
                   setup.replace(**changed(lo)), limits)
    nxt = at(lo + 1)                                   # == hi here: the check that one more does not fit
    return Fit(vary, lo * step, at(lo)[0], (lo + 1) * step, nxt[0], step, len(cache), time.perf_counter() - started,
               nxt[2], setup.replace(**changed(lo)), limits)


def show(found: dict, gpu: str | None = None) -> None:
    """Print each answer of `found` ({vary: Fit}): the largest value with its verdict, and the next value's (`gpu`: the
    preset the verdicts count). Introduced in notebooks/07."""
    _found(found, "show")
    for vary, f in found.items():
        line = fits(f.result, gpu)[1] if f.result else "even the smallest does not fit"
        print(f"largest {vary}: {f.value}: {line}")
        print(f"   {vary} {f.next_value}: " + (fits(f.next_result, gpu)[1] if f.next_result else f.why))


def check(found: dict, gpu: str | None = None) -> None:
    """Assert that each answer of `found` fits and that one step more does not. Introduced in notebooks/07."""
    _found(found, "check")
    for vary, f in found.items():
        assert f.value == 0 or fits(f.result, gpu)[0], f"{vary} {f.value} does not fit"
        assert f.next_result is None or not fits(f.next_result, gpu)[0], f"{vary} {f.next_value} fits too"


def table(f: Fit) -> str:
    """The answer as text: the line, and the GPU/host peaks of the answer and of the next value, in GiB."""
    if not isinstance(f, Fit):
        raise InputError(f"table needs a Fit (an answer of fit.largest), got {type(f).__name__}")
    lines = [f.line()]
    for label, value, r in (("answer", f.value, f.result), ("next", f.next_value, f.next_result)):
        if r is not None:
            lines.append(f"  {label:7s}{f.vary} {value}: GPU peak {to_gib(r.gpu.peak_bytes):.2f} GiB, host peak "
                         f"{to_gib(r.host.peak_bytes):.2f} GiB per node")
    if f.result is not None:
        from helpers import report

        caution = report.reserve_caution(f.result)
        lines += [f"  {caution}"] if caution else []
    return "\n".join(lines)
