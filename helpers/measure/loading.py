"""Loading a model, measured: a twin saved as a real checkpoint (safetensors shards, in its config's dtype) is loaded
with transformers' `from_pretrained` in a fresh process, once in the checkpoint's own dtype and once converted to
float32, and the process's private memory is read while it loads.

Per load, in its own process: anonymous resident memory (RssAnon: private pages, what a rank cannot share with the
others of its node) sampled every millisecond from just before `from_pretrained` to its return, the peak resident size
(VmHWM, reset before the load; it also counts the checkpoint's file pages, which are the page cache's), and the bytes
of the loaded parameters (`numel * element_size`) with where their storage lives (inside a mapping of a checkpoint
file, or not). The estimate's rule (`helpers.estimate.loading.host_copy`) is set beside: nothing per rank when the
dtypes agree (the parameters are views of the memory-mapped files), the whole model in the loaded dtype when they
differ. What the process allocates besides (transformers' own objects, a thread pool) is the same in both loads; the
difference of the two loads' private peaks is the converted copy.
A third load runs the float32 load on two ranks (torchrun, gloo) as accelerate's FSDP sets them up with
`fsdp_cpu_ram_efficient_loading: true` (ACCELERATE_USE_FSDP and FSDP_CPU_RAM_EFFICIENT_LOADING in the environment,
which transformers' `is_fsdp_enabled` reads): transformers 4 left the parameters of every rank but local rank 0 on
the meta device, and accelerate's comments still say so; whether the installed transformers does is measured, not
assumed (rank 1's private memory against the one-rank load's).
The twin is wider than the default one (hidden 1024) so the copy is hundreds of MiB, well above a Python process's
noise. `python -m helpers.measure.loading MODEL` prints the measurement; `--save` writes it to
data/results/model_loading.json.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sys
import tempfile
from pathlib import Path

from helpers import estimate, models, provenance
from helpers.errors import InputError
from helpers.estimate import loading
from helpers.measure import children, procgroup, procmem
from helpers.training import TrainSetup
from helpers.units import fmt, to_gib

HIDDEN = 1024
SAVED = models.DATA_DIR / "results" / "model_loading.json"
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# The two loads and the set-up whose rule each stands for: a pure-bf16 run loads the checkpoint's own dtype; a
# bf16-mixed run on one GPU loads float32 weights (its fp32 master copy is the model itself).
LOADS = {"same dtype": TrainSetup(precision="bf16"), "float32": TrainSetup(precision="bf16-mixed")}


def _save_checkpoint(twin: str, out: str) -> dict:
    import torch
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(twin)
    dtype = getattr(torch, TORCH_DTYPES[models.spec(twin).checkpoint_dtype or "bf16"])
    torch.manual_seed(0)
    net = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    net.save_pretrained(out, max_shard_size="100MB")        # several shards, as a real checkpoint is written
    return {"files": sorted(p.name for p in Path(out).glob("*.safetensors")),
            "bytes": sum(p.stat().st_size for p in Path(out).glob("*.safetensors"))}


def _mapped_files() -> list[tuple[int, int]]:
    """Address ranges of this process's mappings of .safetensors files."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            if line.rstrip().endswith(".safetensors"):
                lo, hi = line.split()[0].split("-")
                out.append((int(lo, 16), int(hi, 16)))
    return out


def _load(checkpoint: str, dtype: str) -> dict:
    import torch
    import transformers

    with procmem.growth() as g:
        net = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=getattr(torch, TORCH_DTYPES[dtype]))
    maps = _mapped_files()
    params = list(net.parameters())
    in_file = [p for p in params if any(lo <= p.data_ptr() < hi for lo, hi in maps)]
    return {"dtype": dtype, "param_bytes": sum(p.numel() * p.element_size() for p in params),
            "params_in_file_mappings": len(in_file), "params": len(params),
            "anon_growth": g["anon"], "peak_growth": g["peak"], "load_s": round(g["seconds"], 3)}


FSDP_RANKS = 2
FSDP_ENV = {"ACCELERATE_USE_FSDP": "true", "FSDP_CPU_RAM_EFFICIENT_LOADING": "true"}


def _fsdp_load(checkpoint: str, dtype: str) -> dict:
    """One rank's load under torchrun with accelerate's FSDP variables set (the process group made first, as
    accelerate's Accelerator makes it before the Trainer loads the model)."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    got = _load(checkpoint, dtype) | {"rank": dist.get_rank(), "env": {k: os.environ.get(k) for k in FSDP_ENV}}
    dist.barrier()
    return got


def run(model: str, hidden: int = HIDDEN) -> dict:
    """Save `model`'s twin (hidden `hidden`) as a checkpoint, load it in each LOADS dtype in a fresh process, and set
    the estimate's per-rank host copy beside each load's private memory."""
    import psutil

    twin = str(models.scaled_path(model, hidden))
    spec = models.spec(twin)
    if spec.checkpoint_dtype is None:
        raise InputError(f"{model}'s config names no dtype its weights are saved in: a loading measurement needs one")
    need = 4 * spec.params * 4 + int(1.5 * 2**30)          # the twin built, saved and loaded: a few fp32 copies
    if need > 0.8 * psutil.virtual_memory().available:
        raise InputError(f"refused: the loading measurement needs about {to_gib(need):.1f} GiB, more than 80% of the "
                         f"{to_gib(psutil.virtual_memory().available):.1f} GiB available")
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    out = {"model": model, "twin": twin, "params": spec.params, "checkpoint_dtype": spec.checkpoint_dtype,
           "loads": {}, "date": datetime.datetime.now().isoformat(timespec="seconds"), "versions": provenance.versions()}
    with tempfile.TemporaryDirectory(prefix="oom-loading-") as tmp:
        base = [sys.executable, "-m", "helpers.measure.loading", "--twin", twin, "--dir", tmp]
        out["checkpoint"] = _child(base + ["--action", "save"], env)
        for name, setup in LOADS.items():
            dtype = spec.checkpoint_dtype if name == "same dtype" else loading.loaded_dtype(setup, spec)
            got = _child(base + ["--action", "load", "--dtype", dtype], env)
            got["setup"] = {"precision": setup.precision, "strategy": setup.strategy}
            got["estimate_per_rank"] = loading.host_copy(setup, spec) if dtype != spec.checkpoint_dtype else 0
            got["estimate_host_setup"] = estimate.run(spec, setup).host.phases["setup"]
            out["loads"][name] = got
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(FSDP_RANKS), "--master_port",
               str(procgroup.free_port()), "-m", "helpers.measure.loading", "--twin", twin, "--dir", tmp, "--action",
               "load-fsdp", "--dtype", "fp32"]
        proc = children.run(cmd, env | FSDP_ENV, timeout=600, what="the FSDP loading measurement")
        ranks = sorted((json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")), key=lambda r: r["rank"])
    same, conv = out["loads"]["same dtype"], out["loads"]["float32"]
    out["converted_copy"] = conv["anon_growth"] - same["anon_growth"]
    fsdp = TrainSetup(strategy="fsdp2", gpus=FSDP_RANKS, precision="bf16-mixed")
    out["fsdp_cpu_ram_efficient_loading"] = {
        "env": FSDP_ENV, "ranks": ranks, "estimate_per_rank": loading.host_copy(fsdp, spec),
        "converted_copy_per_rank": [x["anon_growth"] - same["anon_growth"] for x in ranks]}
    return out


def _child(cmd, env) -> dict:
    proc = children.run(cmd, env, timeout=600, what="the loading measurement")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def describe(r: dict) -> str:
    """The measurement in a few lines (MiB and GiB: 2^20 and 2^30 bytes)."""
    lines = [f"{r['model']}'s twin, {r['params']:,} parameters, saved as {len(r['checkpoint']['files'])} safetensors "
             f"shards in {r['checkpoint_dtype']} ({fmt(r['checkpoint']['bytes'])})"]
    for name, x in r["loads"].items():
        lines.append(f"  loaded as {x['dtype']:5s}: private memory +{fmt(x['anon_growth'])}, peak resident "
                     f"+{fmt(x['peak_growth'])}; parameters {fmt(x['param_bytes'])}, {x['params_in_file_mappings']} of "
                     f"{x['params']} inside the checkpoint's file mappings; the estimate's copy per rank: "
                     f"{fmt(x['estimate_per_rank'])}")
    est = r["loads"]["float32"]["estimate_per_rank"]
    lines.append(f"  converted copy (private memory of the float32 load less the same-dtype load's): "
                 f"{fmt(r['converted_copy'])}, estimate {fmt(est)} ({r['converted_copy'] / est - 1:+.2%})")
    f = r.get("fsdp_cpu_ram_efficient_loading")
    if f:
        each = ", ".join(f"rank {x['rank']} {fmt(c)}" for x, c in zip(f["ranks"], f["converted_copy_per_rank"]))
        lines.append(f"  float32 on {len(f['ranks'])} ranks under accelerate's FSDP with cpu_ram_efficient_loading: "
                     f"converted copy {each}; estimate {fmt(f['estimate_per_rank'])} per rank")
    return "\n".join(lines)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?")
    p.add_argument("--twin")
    p.add_argument("--dir")
    p.add_argument("--action", choices=["save", "load", "load-fsdp"])
    p.add_argument("--dtype", choices=list(TORCH_DTYPES))
    p.add_argument("--save", action="store_true", help=f"write the measurement to {SAVED}")
    args = p.parse_args()
    if args.action:
        children.watch_owner()
        with contextlib.redirect_stdout(sys.stderr):
            result = (_save_checkpoint(args.twin, args.dir) if args.action == "save"
                      else _fsdp_load(args.dir, args.dtype) if args.action == "load-fsdp"
                      else _load(args.dir, args.dtype))
        sys.stdout.write(json.dumps(result) + "\n")      # one write under PIPE_BUF: two ranks' lines stay whole
        sys.stdout.flush()
    else:
        measured = run(args.model or "llama-3.2-1b")
        print(describe(measured))
        if args.save:
            from helpers.files import write_text_atomically

            write_text_atomically(SAVED, json.dumps(measured, indent=1) + "\n")
            print(f"saved to {SAVED}")
