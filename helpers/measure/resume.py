"""Resuming from a checkpoint, measured: DeepSpeed saves a twin's training state, and a fresh process loads it
while its own offloaded buffers are alive; the host memory of that load is the resume transient.

A load reads this rank's optimizer shard (`*_optim_states.pt`: fp32 master partition and both Adam states) with
`torch.load(map_location='cpu')`, so for a moment the loaded copy sits beside the live buffers. Measured per load,
in its own process: resident memory just before `load_checkpoint`, the peak during it (Linux's VmHWM, reset
before the load), and the peak of anonymous memory (sampled every millisecond; file-backed pages of an mmap-ed
load are the page cache's, which the kernel can drop). Variants: the default load; `mmap` (torch.load with
mmap=True, patched into DeepSpeed's checkpoint engine); `no_optimizer` (`load_optimizer_states=False`).
The twin is wider than the default one (hidden 768) so the transient is hundreds of MiB, well above the noise of
a Python process. On a CPU, 'GPU' and host are one RAM: the offload ratio moves buffers between roles, not out of
this RAM, so its effect is read from the census by role, while the transient is measured whole.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from helpers import deepspeed_rules, estimate, models, provenance
from helpers.errors import InputError
from helpers.measure import children, procmem
from helpers.training import TrainSetup, checked
from helpers.units import to_gib

VARIANTS = ("default", "mmap", "no_optimizer")
HIDDEN = 768


def _engine(twin: str, s: TrainSetup):
    """DeepSpeed in this process (one rank, gloo) on the twin, with the set-up's ZeRO configuration."""
    from helpers.measure import engines, procgroup
    from helpers.measure.scaled import initialize_deepspeed

    procgroup.ensure("gloo", 1)
    torch.manual_seed(0)
    net = engines.build_model(twin, s, torch.float32, "sdpa")
    engine, optimizer, _ = initialize_deepspeed(net, s)
    return engine, optimizer


def _host_buffers(optimizer, ratio: float) -> dict:
    """Bytes of the optimizer's fp32 buffers by the role DeepSpeed's ratio rule gives each sub-group."""
    groups = list(getattr(optimizer, "fp32_partitioned_groups_flat", []))
    n = len(groups)
    first_host = deepspeed_rules.first_host_group(n, ratio)
    out = {"gpu": 0, "host": 0}
    for i, g in enumerate(groups):
        role = "gpu" if i < first_host else "host"
        tensors = [g, g.grad] + [v for v in optimizer.optimizer.state.get(g, {}).values()
                                 if isinstance(v, torch.Tensor) and v.numel() > 1]
        out[role] += sum(t.numel() * t.element_size() for t in tensors if t is not None)
    return out | {"sub_groups": n, "first_host_group": first_host}


def _save(a) -> dict:
    s = TrainSetup(**json.loads(a.setup))
    engine, _ = _engine(a.twin, s)
    ids = torch.randint(0, models.spec(a.twin).vocab, (s.batch, s.seq), generator=torch.Generator().manual_seed(1))
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    engine.save_checkpoint(a.dir, tag="resume")
    files = {p.name: p.stat().st_size for p in Path(a.dir, "resume").iterdir()}
    return {"saved": files, "loss": float(loss)}


def _load(a) -> dict:
    s = TrainSetup(**json.loads(a.setup))
    engine, optimizer = _engine(a.twin, s)
    if a.variant == "mmap":
        from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

        TorchCheckpointEngine.load = lambda self, path, map_location=None: torch.load(
            path, map_location=map_location, weights_only=False, mmap=True)
    live = _host_buffers(optimizer, s.ratio)
    with procmem.growth() as g:
        engine.load_checkpoint(a.dir, tag="resume", load_optimizer_states=a.variant != "no_optimizer")
    return {"variant": a.variant, "rss_before": g["before"], "peak": g["before"] + g["peak"], "transient": g["peak"],
            "anon_transient": g["anon"], "live_buffers": live, "load_s": round(g["seconds"], 3)}


def run(model, setup: TrainSetup, variants=VARIANTS, hidden: int = HIDDEN) -> dict:
    """Save a DeepSpeed checkpoint of `model`'s twin under `setup` (ZeRO with optimizer offload), then load it once
    per variant in a fresh process. Returns the measurements and the estimate of the same twin."""
    from helpers.measure import scaled

    setup = checked(setup)
    if not (setup.strat.deepspeed and setup.offload_optimizer) or setup.gpus != 1:
        raise InputError(f"a resume measurement runs DeepSpeed ZeRO with offload_optimizer on one rank; got "
                         f"strategy {setup.strategy!r}, offload_optimizer={setup.offload_optimizer}, gpus={setup.gpus} "
                         f"(the estimate covers the others: `estimate` with --resume)")
    for v in variants:
        if v not in VARIANTS:
            raise InputError(f"unknown resume variant {v!r}: allowed are {', '.join(VARIANTS)}")
    twin, s = scaled.scaled_setup(model, setup.replace(resume=False), hidden)
    est = estimate.run(str(twin), s.replace(resume=True))
    import psutil

    need = 3 * est.host.phases["resume"] + est.gpu.peak_bytes + int(1.5 * 2**30)
    if need > 0.8 * psutil.virtual_memory().available:
        raise InputError(f"refused: the resume measurement needs about {to_gib(need):.1f} GiB by its estimate, more than "
                         f"80% of the {to_gib(psutil.virtual_memory().available):.1f} GiB available")
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    out = {"model": model, "twin": str(twin), "params": models.spec(str(twin)).params, "setup": dataclasses.asdict(s),
           "estimate": est.to_dict(), "loads": {}, "date": datetime.datetime.now().isoformat(timespec="seconds"),
           "versions": provenance.versions()}
    with tempfile.TemporaryDirectory(prefix="oom-resume-") as tmp:
        base = [sys.executable, "-m", "helpers.measure.resume", "--twin", str(twin), "--setup",
                json.dumps(dataclasses.asdict(s)), "--dir", tmp]
        out["save"] = _child(base + ["save"], env)
        for v in variants:
            out["loads"][v] = _child(base + ["load", "--variant", v], env)
    return out


def _child(cmd, env) -> dict:
    proc = children.run(cmd, env, timeout=600, what="the resume measurement")
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--twin", required=True)
    p.add_argument("--setup", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("action", choices=["save", "load"])
    p.add_argument("--variant", default="default", choices=VARIANTS)
    args = p.parse_args()
    children.watch_owner()
    with contextlib.redirect_stdout(sys.stderr):           # DeepSpeed prints; only the JSON goes to stdout
        result = (_save if args.action == "save" else _load)(args)
    print(json.dumps(result))
