"""Saving a checkpoint, measured on the real DeepSpeed engine: a twin trained one step under ZeRO-2 or ZeRO-3 on this
CPU (1 or 2 processes, gloo), then the save calls the HF Trainer makes, each rank's private memory (RssAnon) read
around them, and the estimate's save items (`helpers.estimate.saving`) set beside, per node (the ranks' sum).

The calls, as transformers 5.23's Trainer makes them: `clone_tensors_for_torch_save(module.state_dict())` (what
accelerate's `get_state_dict` does for ZeRO-1/2 in `save_model`), `engine._zero3_consolidated_16bit_state_dict()`
(ZeRO-3 with stage3_gather_16bit_weights_on_model_save) and `engine.save_checkpoint` (the optimizer's files).
On a GPU, `torch.save` copies each CUDA storage to the host (torch/serialization.py `_save`: `storage.cpu()`, one at
a time); here the engine's tensors are host tensors already, so that copy is re-enacted: the zip writer is wrapped
to copy every storage that would be on the GPU just before it is written and drop it after (`--emulate-d2h`; storages
an offloaded optimizer keeps on the host are written without a copy, as on a GPU). Rows say which are re-enacted.
The ZeRO-3 gather's all-gathers run on gloo here and leave scratch on the host that a GPU keeps on the device: that
row compares the bytes of the state dict's tensors rank 0 holds after the gather (numel x element size, each storage
once) and prints the private memory beside it.

`python -m helpers.measure.saving [--save]` runs every case (about 3 minutes) and with --save writes
data/results/checkpoint_save.json.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import json
import os
import sys
import tempfile

from helpers import estimate, models, provenance
from helpers.measure import children, procgroup, procmem
from helpers.training import TrainSetup
from helpers.units import MiB, fmt

MODEL, HIDDEN = "llama-3.2-1b", 1024
SAVED = models.DATA_DIR / "results" / "checkpoint_save.json"
SUB_GROUP = 30_000_000          # a ZeRO-3 run with several optimizer sub-groups
# (case, world size, worker flags, the estimate's set-up, the estimate's item, what is compared)
CASES = (
    ("ZeRO-2 save_model (state dict cloned)", 1, ["--call", "clone"], dict(strategy="zero2"),
     "state dict cloned to the host for save_model", "peak"),
    ("ZeRO-2 save_model (state dict cloned)", 2, ["--call", "clone"], dict(strategy="zero2"),
     "state dict cloned to the host for save_model", "peak"),
    ("ZeRO-2 save_checkpoint", 1, ["--call", "save", "--emulate-d2h"], dict(strategy="zero2"),
     "checkpoint files written", "peak"),
    ("ZeRO-2 save_checkpoint", 2, ["--call", "save", "--emulate-d2h"], dict(strategy="zero2"),
     "checkpoint files written", "peak"),
    ("ZeRO-2 save_checkpoint, optimizer offloaded", 1, ["--call", "save", "--emulate-d2h", "--offload"],
     dict(strategy="zero2", offload_optimizer=True), "checkpoint files written", "peak"),
    ("ZeRO-3 16-bit gather (stage3_gather_16bit_weights_on_model_save)", 1, ["--call", "gather"],
     dict(strategy="zero3"), "16-bit model gathered on rank 0", "held"),
    ("ZeRO-3 16-bit gather (stage3_gather_16bit_weights_on_model_save)", 2, ["--call", "gather"],
     dict(strategy="zero3"), "16-bit model gathered on rank 0", "held"),
    ("ZeRO-3 save_checkpoint, sub-groups of 30M", 1, ["--call", "save", "--emulate-d2h", "--sub-group-size",
                                                      str(SUB_GROUP)],
     dict(strategy="zero3", sub_group_size=SUB_GROUP), "optimizer sub-group written", "peak"),
)


class _Writer:
    """torch.save's zip writer, copying each storage that would be on the GPU before it is written (what
    `storage.cpu()` allocates), the copy dropped after."""

    def __init__(self, real, on_host: set, log: list):
        self._real, self._on_host, self._log = real, on_host, log

    def write_record(self, name, data, nbytes):
        import torch

        if isinstance(data, torch.UntypedStorage) and nbytes and data.data_ptr() not in self._on_host:
            copy = torch.UntypedStorage(data.size())
            copy.copy_(data)
            self._log.append(nbytes)
            self._real.write_record(name, copy, nbytes)
            del copy
        else:
            self._real.write_record(name, data, nbytes)

    def __getattr__(self, k):
        return getattr(self._real, k)


def _reenact_copies(on_host: set, log: list) -> None:
    import torch.serialization as ser

    original = ser._open_zipfile_writer

    class Wrapped:
        def __init__(self, f):
            self.inner = original(f)

        def __enter__(self):
            return _Writer(self.inner.__enter__(), on_host, log)

        def __exit__(self, *a):
            return self.inner.__exit__(*a)

    ser._open_zipfile_writer = Wrapped


def _engine(twin: str, stage: int, offload: bool, sub_group: int):
    import deepspeed
    import torch
    import transformers

    transformers.utils.logging.set_verbosity_error()
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None     # CPU, no shm op (FINDINGS)
    zero = {"stage": stage, "reduce_bucket_size": 5_000_000, "allgather_bucket_size": 5_000_000, "overlap_comm": False}
    if stage == 3:
        zero.update(sub_group_size=sub_group, stage3_prefetch_bucket_size=5_000_000,
                    stage3_param_persistence_threshold=0, stage3_gather_16bit_weights_on_model_save=True)
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
              "zero_optimization": zero, "steps_per_print": 10**9,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}}
    cfg = transformers.AutoConfig.from_pretrained(twin)
    torch.manual_seed(0)
    if stage == 3:
        with deepspeed.zero.Init(config_dict_or_path=config):
            net = transformers.AutoModelForCausalLM.from_config(cfg)
    else:
        net = transformers.AutoModelForCausalLM.from_config(cfg)
    engine, optimizer, _, _ = deepspeed.initialize(model=net, config=config)
    ids = torch.randint(0, cfg.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1))
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()
    return engine, optimizer


def _offloaded(optimizer) -> set:
    """The storages an offloaded optimizer keeps on the host (fp32 partitions, Adam states): written as they are."""
    out = {g.untyped_storage().data_ptr() for g in getattr(optimizer, "single_partition_of_fp32_groups", [])}
    for state in optimizer.optimizer.state.values():
        out |= {v.untyped_storage().data_ptr() for v in state.values() if hasattr(v, "untyped_storage")}
    return out


def _worker(a) -> dict:
    if "LOCAL_RANK" not in os.environ:                  # one process without a launcher
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(procgroup.free_port()))
    import torch
    import torch.distributed as dist

    engine, optimizer = _engine(a.twin, 3 if a.stage3 else 2, a.offload, a.sub_group_size)
    copies: list[int] = []
    if a.emulate_d2h:
        _reenact_copies(_offloaded(optimizer) if a.offload else set(), copies)
    held = None
    with tempfile.TemporaryDirectory(prefix="oom-save-") as tmp:
        dist.barrier()
        with procmem.growth() as g:
            if a.call == "save":
                engine.save_checkpoint(tmp, tag="t")
            elif a.call == "clone":
                from deepspeed.checkpoint.utils import clone_tensors_for_torch_save

                held = clone_tensors_for_torch_save(engine.module.state_dict())
            else:
                held = engine._zero3_consolidated_16bit_state_dict()
        dist.barrier()
    held_bytes = 0
    if isinstance(held, dict):
        seen = set()
        for v in held.values():
            if torch.is_tensor(v) and v.untyped_storage().data_ptr() not in seen:
                seen.add(v.untyped_storage().data_ptr())
                held_bytes += v.untyped_storage().nbytes()
    return {"rank": dist.get_rank(), "peak": g["anon"], "after": g["anon_after"], "held_tensor_bytes": held_bytes,
            "largest_copy": max(copies, default=0), "copied": sum(copies)}


def run() -> dict:
    """Every case in fresh processes, with the estimate's item beside it (per node: the ranks' sum)."""
    twin = str(models.scaled_path(MODEL, HIDDEN))
    spec = models.spec(twin)
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    rows = []
    for name, world, flags, setup, item, compared in CASES:
        flags = flags + (["--stage3"] if setup["strategy"] == "zero3" else [])
        cmd = [sys.executable, "-m", "helpers.measure.saving", "--worker", "--twin", twin, *flags]
        if world > 1:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world), "--master_port",
                   str(procgroup.free_port()), "-m", "helpers.measure.saving", "--worker", "--twin", twin, *flags]
        proc = children.run(cmd, env, timeout=900, what="the checkpoint-save measurement")
        ranks = sorted((json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")), key=lambda r: r["rank"])
        s = TrainSetup(gpus=world, gpus_per_node=world, **setup)
        r = estimate.run(spec, s)
        rule = sum(i["bytes"] for i in r.meta["saving"] if i["name"].startswith(item) and i["device"] == "host")
        got = sum(x["peak"] if compared == "peak" else x["held_tensor_bytes"] for x in ranks)
        rows.append({"case": name, "world": world, "setup": setup, "estimate_item": item, "compared": compared,
                     "ranks": ranks, "measured": got, "estimate": rule, "ratio": got / rule if rule else None,
                     "reenacted": "--emulate-d2h" in flags})
    return {"model": MODEL, "twin": twin, "params": spec.params, "rows": rows,
            "date": datetime.datetime.now().isoformat(timespec="seconds"), "versions": provenance.versions()}


def describe(r: dict) -> str:
    """One line per case (MiB = 2^20 bytes)."""
    lines = [f"{r['model']}'s twin ({r['params']:,} parameters), one ZeRO step on this CPU, then the save calls "
             f"(private memory per node, the ranks' sum):"]
    for x in r["rows"]:
        what = "the state dict's tensors held" if x["compared"] == "held" else "peak"
        extra = (f"; private memory held after {fmt(sum(k['after'] for k in x['ranks']))}, peak "
                 f"{fmt(sum(k['peak'] for k in x['ranks']))} (gloo's all-gather scratch, on the device on a GPU)"
                 if x["compared"] == "held" else "")
        lines.append(f"  {x['case']}, {x['world']} rank(s){' (GPU copies re-enacted)' if x['reenacted'] else ''}: "
                     f"{what} {x['measured'] / MiB:.1f} MiB, estimate {x['estimate'] / MiB:.1f} MiB "
                     f"({x['ratio'] - 1:+.2%}){extra}")
    return "\n".join(lines)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true")
    p.add_argument("--twin")
    p.add_argument("--call", choices=["save", "clone", "gather"])
    p.add_argument("--stage3", action="store_true")
    p.add_argument("--offload", action="store_true")
    p.add_argument("--emulate-d2h", action="store_true")
    p.add_argument("--sub-group-size", type=int, default=1_000_000_000)
    p.add_argument("--save", action="store_true", help=f"write the measurement to {SAVED}")
    args = p.parse_args()
    if args.worker:
        with contextlib.redirect_stdout(sys.stderr):
            result = _worker(args)
        print(json.dumps(result), flush=True)
    else:
        measured = run()
        print(describe(measured))
        if args.save:
            from helpers.files import write_text_atomically

            write_text_atomically(SAVED, json.dumps(measured, indent=1) + "\n")
            print(f"saved to {SAVED}")
