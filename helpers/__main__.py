"""Command line: `python -m helpers estimate --model llama-3-8b --strategy zero2 ...` (see --help).

Prints a table in GiB (2**30 bytes), or with --json the Result object. Bad input exits 2 with one line naming it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from helpers.errors import InputError
from helpers.training import ADAM_IMPLS, ATTENTIONS, OPTIMIZERS, PRECISIONS, STRATEGIES, TrainSetup


def setup_parser(p: argparse.ArgumentParser) -> None:
    """The set-up flags shared by every sub-command."""
    p.add_argument("--model", required=True, help="catalogue name (see `models`) or path to a config.json")
    p.add_argument("--batch", type=int, default=1, help="micro batch per GPU (default 1)")
    p.add_argument("--seq", type=int, default=2048, help="sequence length in tokens (default 2048)")
    p.add_argument("--precision", default="bf16-mixed", metavar="{" + ",".join(PRECISIONS) + "}")
    p.add_argument("--adam-impl", default=None, metavar="{" + ",".join(ADAM_IMPLS) + "}",
                   help="torch AdamW implementation (single/ddp/fsdp2; default foreach)")
    p.add_argument("--optimizer", default="adamw", metavar="{" + ",".join(OPTIMIZERS) + "}",
                   help="adamw (default) or bitsandbytes' adamw-8bit (single/ddp)")
    p.add_argument("--lora-rank", type=int, default=None, metavar="R",
                   help="LoRA adapters of rank R on every linear layer, base frozen (single/ddp/zero1/zero2)")
    p.add_argument("--strategy", default="single", metavar="{" + ",".join(STRATEGIES) + "}")
    p.add_argument("--gpus", type=int, default=1, help="world size (default 1)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs sharing one host (default 8)")
    p.add_argument("--offload-optimizer", action="store_true")
    p.add_argument("--offload-params", action="store_true")
    p.add_argument("--offload-ratio", type=float, default=None, metavar="R", help="ZeRO-3 partial offload, in [0, 1]")
    p.add_argument("--pin-memory", dest="pin_memory", action="store_true", default=True,
                   help="offloaded buffers page-locked (default)")
    p.add_argument("--no-pin-memory", dest="pin_memory", action="store_false")
    p.add_argument("--grad-checkpointing", action="store_true")
    p.add_argument("--fused-ce", action="store_true", help="fused/chunked linear cross-entropy")
    p.add_argument("--attention", default="sdpa", metavar="{" + ",".join(ATTENTIONS) + "}")
    p.add_argument("--gpu-gib", type=float, default=None, metavar="X", help="GPU capacity in GiB")
    p.add_argument("--host-gib", type=float, default=None, metavar="Y", help="host RAM per node in GiB")
    p.add_argument("--resume", action="store_true", help="add the resume-from-checkpoint phase")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--items", action="store_true", help="also list every named buffer behind the figures")


def setup_from_args(a: argparse.Namespace) -> TrainSetup:
    return TrainSetup(
        batch=a.batch, seq=a.seq, precision=a.precision, adam_impl=a.adam_impl, optimizer=a.optimizer,
        lora_rank=a.lora_rank, strategy=a.strategy, gpus=a.gpus,
        gpus_per_node=a.gpus_per_node, offload_optimizer=a.offload_optimizer, offload_params=a.offload_params,
        offload_ratio=a.offload_ratio, pin_memory=a.pin_memory, grad_checkpointing=a.grad_checkpointing,
        fused_ce=a.fused_ce, attention=a.attention, gpu_gib=a.gpu_gib, host_gib=a.host_gib, resume=a.resume,
    ).validate()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers", description="LLM training memory, per phase, in GiB.")
    sub = parser.add_subparsers(dest="command", required=True)
    setup_parser(sub.add_parser("estimate", help="analytic estimate (instant, no tensors)"))
    measure = sub.add_parser("measure", help="measured memory: dry-run (full size, fake tensors), scaled (tiny twin, "
                                             "real, this CPU)")
    setup_parser(measure)
    measure.add_argument("--mode", default="scaled", choices=["dry-run", "scaled", "gpu"],
                         help="scaled (default): the tiny twin trained for real on this CPU through the set-up's engine; "
                              "dry-run: the full-size step on fake tensors; gpu: the full-size step on CUDA")
    measure.add_argument("--steps", type=int, default=3, help="scaled: training steps (default 3)")
    measure.add_argument("--save", metavar="PATH", default=None,
                         help="also write the result as JSON (atomically), e.g. data/results/NAME.json")
    measure.add_argument("--no-progress", action="store_true", help="no progress bar")
    sub.add_parser("models", help="list the model catalogue")
    a = parser.parse_args(argv)
    try:
        if a.command == "models":
            from helpers import models
            for name in models.catalogue():
                print(f"{name:20s} {models.spec(name).params:>16,d} parameters")
            return 0
        from helpers import estimate, report
        setup = setup_from_args(a)
        if a.command == "measure":
            if a.steps < 1:
                raise InputError(f"steps must be a positive integer, got {a.steps}")
            if a.mode == "dry-run":
                from helpers.measure import dryrun
                result = dryrun.run(a.model, setup, progress=not a.no_progress)
            elif a.mode == "scaled":
                from helpers.measure import scaled
                result = scaled.run(a.model, setup, steps=a.steps)
            else:
                from helpers.measure import gpu
                result = gpu.run(a.model, setup, snapshot=a.save and a.save.replace(".json", ".pickle"))
            if a.save and int(os.environ.get("RANK", "0")) == 0:
                result.save(a.save)
        else:
            result = estimate.run(a.model, setup)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if int(os.environ.get("RANK", "0")) != 0:          # under a launcher, rank 0 reports
        return 0
    print(json.dumps(result.to_dict(), indent=1) if a.json else report.table(result))
    if a.items and not a.json:
        print("\n" + report.items_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
