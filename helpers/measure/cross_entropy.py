"""The output head and its cross-entropy alone: plain (full logits, upcast to fp32) against torch's chunked
`linear_cross_entropy` (Liger's algorithm: gradients made in forward, chunk by chunk), forward and backward.

Two ways to measure one shape (tokens x hidden, vocabulary):
- `dry`: on fake tensors at any size, every tensor counted by the tracker. The chunked op is one custom op, so
  only what it returns is seen, not its per-chunk scratch (which `estimate`'s Liger chunk rule gives).
- `real`: on this CPU, in a fresh process, the peak resident memory above the inputs (Linux's VmHWM, reset once the
  inputs exist; it sees everything, scratch included) and the wall time. Refused before it starts when it would not fit in RAM.
`agreement` runs both implementations on the same real inputs and returns their largest differences.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import psutil
import torch

from helpers.errors import InputError
from helpers.measure import children, procmem
from helpers.units import to_gib

IMPLS = ("plain", "chunked")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _check(tokens, hidden, vocab, dtype, impl="plain"):
    for name, v in (("tokens", tokens), ("hidden", hidden), ("vocab", vocab)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"{name} must be a positive integer, got {v!r}")
    if dtype not in DTYPES:
        raise InputError(f"unknown dtype {dtype!r}: allowed are {', '.join(DTYPES)}")
    if impl not in IMPLS:
        raise InputError(f"unknown implementation {impl!r}: allowed are {', '.join(IMPLS)}")


def loss(x, weight, target, impl: str):
    """The mean next-token loss of hidden states `x` (tokens x hidden) through the head `weight` (vocab x hidden)."""
    if impl == "plain":                      # as Hugging Face's ForCausalLMLoss and Liger's benchmark baseline do
        return torch.nn.functional.cross_entropy((x @ weight.T).float(), target)
    from helpers.measure.engines import chunked_ce_options

    return torch.nn.functional.linear_cross_entropy(x, weight, target, options=chunked_ce_options())


def inputs(tokens, hidden, vocab, dtype, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(tokens, hidden, generator=gen) * 0.5).to(DTYPES[dtype]).to(device).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=gen) * hidden ** -0.5).to(DTYPES[dtype]).to(device).requires_grad_()
    y = torch.randint(0, vocab, (tokens,), generator=gen).to(device)
    return x, w, y


def input_bytes(tokens, hidden, vocab, dtype) -> int:
    e = DTYPES[dtype].itemsize
    return tokens * hidden * e + vocab * hidden * e + tokens * 8


def dry(tokens: int, hidden: int, vocab: int, dtype: str = "bf16", impl: str = "plain") -> dict:
    """Peak bytes of forward + backward above the inputs, on fake tensors (no memory is allocated)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from helpers.measure import fakegpu
    from helpers.measure.tracker import Tracker

    _check(tokens, hidden, vocab, dtype, impl)
    with FakeTensorMode(allow_non_fake_inputs=True):
        dev = fakegpu.device()
        x = torch.empty(tokens, hidden, dtype=DTYPES[dtype], device=dev, requires_grad=True)
        w = torch.empty(vocab, hidden, dtype=DTYPES[dtype], device=dev, requires_grad=True)
        y = torch.randint(0, vocab, (tokens,), device=dev)
        tracker = Tracker()
        with tracker:
            tracker.label([x, w, y], "parameters")
            with tracker.phase("forward", activity="forward"):
                out = loss(x, w, y, impl)
            with tracker.phase("backward", activity="backward"):
                out.backward()
                del out
    by_phase = tracker.breakdown("gpu")
    peak = max(sum(by_phase[p].values()) for p in ("forward", "backward"))
    return {"mode": "dry", "impl": impl, "tokens": tokens, "hidden": hidden, "vocab": vocab, "dtype": dtype,
            "peak_above_inputs": peak - input_bytes(tokens, hidden, vocab, dtype),
            "note": "chunked: the custom op's outputs only; its per-chunk scratch is not seen" if impl == "chunked" else ""}


def real(tokens: int, hidden: int, vocab: int, dtype: str = "fp32", impl: str = "plain") -> dict:
    """Peak resident memory above the inputs and wall time of forward + backward, in a fresh process on this CPU."""
    _check(tokens, hidden, vocab, dtype, impl)
    need = 24 * tokens * vocab + 4 * input_bytes(tokens, hidden, vocab, dtype)      # plain, generously
    available = psutil.virtual_memory().available
    if need > 0.6 * available:
        raise InputError(f"refused: {impl} cross-entropy at {tokens} x {vocab} could need {to_gib(need):.1f} GiB by "
                         f"its logits ({to_gib(24 * tokens * vocab):.1f} GiB at 24 B per logit), and "
                         f"{to_gib(available):.1f} GiB is available: use fewer tokens or a smaller vocabulary")
    cmd = [sys.executable, "-m", "helpers.measure.cross_entropy", "--tokens", str(tokens), "--hidden", str(hidden),
           "--vocab", str(vocab), "--dtype", dtype, "--impl", impl]
    proc = children.run(cmd, {**os.environ, "PYTHONWARNINGS": "ignore"}, timeout=600,
                        what=f"the {impl} cross-entropy measurement")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def agreement(tokens: int, hidden: int, vocab: int, dtype: str = "fp32") -> dict:
    """Loss and gradients of both implementations on the same real inputs: their largest relative differences."""
    _check(tokens, hidden, vocab, dtype)
    out = {}
    for impl in IMPLS:
        x, w, y = inputs(tokens, hidden, vocab, dtype)
        value = loss(x, w, y, impl)
        value.backward()
        out[impl] = (value.detach().float(), x.grad.float(), w.grad.float())
    rel = lambda a, b: float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
    (lp, xp, wp), (lc, xc, wc) = out["plain"], out["chunked"]
    return {"loss_plain": float(lp), "loss_chunked": float(lc), "loss_rel": rel(lc, lp),
            "grad_input_rel": rel(xc, xp), "grad_weight_rel": rel(wc, wp), "dtype": dtype}


def _child(a) -> dict:
    import gc

    torch.manual_seed(0)
    x, w, y = inputs(a.tokens, a.hidden, a.vocab, a.dtype)
    gc.collect()
    base = procmem.reset_peak()                        # the peak (VmHWM) starts from here: the inputs only
    started = time.perf_counter()
    value = loss(x, w, y, a.impl)
    value.backward()
    wall = time.perf_counter() - started
    peak = procmem.status_bytes("VmHWM")
    return {"mode": "real", "impl": a.impl, "tokens": a.tokens, "hidden": a.hidden, "vocab": a.vocab,
            "dtype": a.dtype, "peak_above_inputs": peak - base, "wall_s": round(wall, 4),
            "loss": float(value), "threads": torch.get_num_threads(),
            "device": f"CPU ({platform.machine()}, {os.cpu_count()} cores)", "torch": torch.__version__}


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    for name in ("tokens", "hidden", "vocab"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--impl", default="plain")
    print(json.dumps(_child(p.parse_args())))
