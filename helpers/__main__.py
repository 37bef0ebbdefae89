"""Command line: `python -m helpers estimate --model llama-3-8b --strategy zero2 ...` (see --help).

Prints a table in GiB (2**30 bytes), or with --json the Result object (and nothing else on stdout: what libraries
print while it runs goes to stderr). Exit status: 0 a result; 2 bad input, with one line `error: ...` naming the
bad value and what is allowed; 1 a measurement or a save that failed (its message says why); 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
from pathlib import Path

from helpers.errors import InputError, MeasurementError
from helpers.training import ADAM_IMPLS, ATTENTIONS, OPTIMIZERS, PRECISIONS, STRATEGIES, TrainSetup


class Parser(argparse.ArgumentParser):
    """argparse with no abbreviations, and usage errors as one line `error: ...` (exit 2), not the usage block."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        found = re.match(r"argument (\S+?)(?:/\S+)?: (must be .*)", message, flags=re.S)
        choice = re.match(r"argument (\S+?)(?:/\S+)?: invalid choice: (.*) \(choose from (.*)\)", message, flags=re.S)
        exclusive = re.match(r"argument (\S+): not allowed with argument (\S+)", message)
        if found:                                  # our own type checks: "--batch must be an integer, got '1e12'"
            message = f"{found.group(1)} {found.group(2)}"
        elif choice:                               # choices written as Python 3.11 writes them (3.13 drops the quotes)
            action = next((a for a in self._actions if choice.group(1) in a.option_strings), None)
            allowed = ", ".join(map(repr, action.choices)) if action is not None and action.choices else choice.group(3)
            message = f"{choice.group(1)} must be one of {allowed}, got {choice.group(2)}"
        elif exclusive:
            message = f"{exclusive.group(2)} and {exclusive.group(1)} exclude each other: give one of them, got both"
        elif message.startswith("the following arguments are required"):
            message += f" (see `{self.prog} --help`)"
        print(f"error: {' '.join(message.split())}", file=sys.stderr)
        sys.exit(2)


def integer(text: str) -> int:
    """An argparse type: a decimal integer ('1e12' and '1.5' are not)."""
    try:
        return int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def number(text: str) -> float:
    """An argparse type: a decimal number (its range is checked by TrainSetup.validate)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None


def setup_parser(p: argparse.ArgumentParser) -> None:
    """The set-up flags shared by every sub-command."""
    p.add_argument("--model", required=True, help="catalogue name (see `models`) or path to a config.json")
    p.add_argument("--batch", type=integer, default=1, help="micro batch per GPU (default 1)")
    p.add_argument("--seq", type=integer, default=2048, help="sequence length in tokens (default 2048)")
    p.add_argument("--precision", default="bf16-mixed", metavar="{" + ",".join(PRECISIONS) + "}")
    p.add_argument("--adam-impl", default=None, metavar="{" + ",".join(ADAM_IMPLS) + "}",
                   help="torch AdamW implementation (single/ddp/fsdp2; default foreach)")
    p.add_argument("--optimizer", default="adamw", metavar="{" + ",".join(OPTIMIZERS) + "}",
                   help="adamw (default) or bitsandbytes' adamw-8bit (single/ddp)")
    p.add_argument("--lora-rank", type=integer, default=None, metavar="R",
                   help="LoRA adapters of rank R on every linear layer, base frozen (single/ddp/zero1/zero2)")
    p.add_argument("--strategy", default="single", metavar="{" + ",".join(STRATEGIES) + "}")
    p.add_argument("--gpus", type=integer, default=1, help="world size (default 1)")
    p.add_argument("--gpus-per-node", type=integer, default=8, help="GPUs sharing one host (default 8)")
    p.add_argument("--offload-optimizer", action="store_true")
    p.add_argument("--offload-params", action="store_true")
    p.add_argument("--offload-ratio", type=number, default=None, metavar="R", help="ZeRO-3 partial offload, in [0, 1]")
    pin = p.add_mutually_exclusive_group()
    pin.add_argument("--pin-memory", dest="pin_memory", action="store_true", default=True,
                     help="offloaded buffers page-locked (default)")
    pin.add_argument("--no-pin-memory", dest="pin_memory", action="store_false")
    p.add_argument("--grad-checkpointing", action="store_true")
    p.add_argument("--fused-ce", action="store_true", help="fused/chunked linear cross-entropy")
    p.add_argument("--attention", default="sdpa", metavar="{" + ",".join(ATTENTIONS) + "}")
    cap = p.add_mutually_exclusive_group()
    cap.add_argument("--gpu-gib", type=number, default=None, metavar="X", help="GPU capacity in GiB")
    cap.add_argument("--gpu", default=None, metavar="NAME",
                     help="a GPU preset: its capacity as nvidia-smi prints it and its CUDA context (see helpers.gpus)")
    p.add_argument("--host-gib", type=number, default=None, metavar="Y", help="host RAM per node in GiB")
    p.add_argument("--resume", action="store_true", help="add the resume-from-checkpoint phase")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--items", action="store_true", help="also list every named buffer behind the figures")


def setup_from_args(a: argparse.Namespace) -> TrainSetup:
    return TrainSetup(
        batch=a.batch, seq=a.seq, precision=a.precision, adam_impl=a.adam_impl, optimizer=a.optimizer,
        lora_rank=a.lora_rank, strategy=a.strategy, gpus=a.gpus,
        gpus_per_node=a.gpus_per_node, offload_optimizer=a.offload_optimizer, offload_params=a.offload_params,
        offload_ratio=a.offload_ratio, pin_memory=a.pin_memory, grad_checkpointing=a.grad_checkpointing,
        fused_ce=a.fused_ce, attention=a.attention, gpu_gib=_gpu_gib(a), host_gib=a.host_gib, resume=a.resume,
    ).validate()


def _gpu_gib(a: argparse.Namespace) -> float | None:
    """--gpu-gib, or the capacity of the --gpu preset (MiB as nvidia-smi prints it, in GiB)."""
    if a.gpu is None:
        return a.gpu_gib
    from helpers import gpus
    return gpus.preset(a.gpu)["gib"]


def main(argv=None) -> int:
    parser = Parser(prog="python -m helpers", description="LLM training memory, per phase, in GiB.")
    sub = parser.add_subparsers(dest="command", required=True)
    setup_parser(sub.add_parser("estimate", help="analytic estimate (instant, no tensors)"))
    measure = sub.add_parser("measure", help="measured memory: dry-run (full size, fake tensors), scaled (tiny twin, "
                                             "real, this CPU)")
    setup_parser(measure)
    measure.add_argument("--mode", default="scaled", choices=["dry-run", "scaled", "gpu"],
                         help="scaled (default): the tiny twin trained for real on this CPU through the set-up's engine; "
                              "dry-run: the full-size step on fake tensors; gpu: the full-size step on CUDA")
    measure.add_argument("--steps", type=integer, default=3, help="scaled: training steps (default 3, at most 1000)")
    measure.add_argument("--save", metavar="PATH", default=None,
                         help="also write the result as JSON (atomically), e.g. data/results/NAME.json")
    measure.add_argument("--no-progress", action="store_true", help="no progress bar")
    measure.add_argument("--alloc-conf", default=None, metavar="SETTINGS",
                         help="dry-run: the caching allocator's settings as PYTORCH_CUDA_ALLOC_CONF takes them, e.g. "
                              "expandable_segments:True (default: PyTorch's defaults)")
    sub.add_parser("models", help="list the model catalogue")
    try:
        try:
            a = parser.parse_args(argv)
        except SystemExit as exc:                      # a usage error (one line, said) or --help
            return exc.code if isinstance(exc.code, int) else 2
        return _run(a)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _run(a: argparse.Namespace) -> int:
    try:
        if a.command == "models":
            from helpers import models
            for name in models.catalogue():
                print(f"{name:20s} {models.spec(name).params:>16,d} parameters")
            return 0
        save = None
        if a.command == "measure" and a.save is not None:
            from helpers.results import check_save_path
            save = check_save_path(a.save)              # before the run: a bad path must not cost the measurement
        with _stdout_to_stderr() if a.json else contextlib.nullcontext():
            result = _result(a, save)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except MeasurementError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if int(os.environ.get("RANK", "0")) != 0:          # under a launcher, rank 0 reports
        return 0
    from helpers import evidence, report

    if a.json:
        doc = result.to_dict() | {"evidence": {"kind": evidence.kind(result), "detail": evidence.detail(result)}}
        print(json.dumps(doc, indent=1), flush=True)
    else:
        print(report.table(result), flush=True)
    if a.items and not a.json:
        print("\n" + report.items_table(result))
    if save is not None:
        try:
            result.save(save)
        except (InputError, OSError) as exc:           # the result is printed above: only the file is missing
            print(f"error: the result was not saved to {str(save)!r}: {exc}", file=sys.stderr)
            return 1
    return 0


def _result(a: argparse.Namespace, save: Path | None):
    from helpers import estimate

    setup = setup_from_args(a)
    if a.command != "measure":
        return estimate.run(a.model, setup)
    from helpers.measure.scaled import check_steps

    check_steps(a.steps)
    if a.alloc_conf is not None:
        from helpers.measure.allocator import Config
        Config.parse(a.alloc_conf)
        if a.mode == "scaled":
            raise InputError("--alloc-conf applies to --mode dry-run (modelled) and gpu (set for CUDA), "
                             "got it with --mode scaled (a CPU run has no CUDA allocator)")
        if a.mode == "gpu":
            os.environ["PYTORCH_CUDA_ALLOC_CONF"] = a.alloc_conf        # read when CUDA's allocator starts
    if a.mode == "dry-run":
        from helpers.measure import dryrun
        return dryrun.run(a.model, setup, progress=not a.no_progress, gpu=a.gpu, alloc_conf=a.alloc_conf)
    if a.mode == "scaled":
        from helpers.measure import scaled
        return scaled.run(a.model, setup, steps=a.steps)
    from helpers.measure import gpu
    return gpu.run(a.model, setup, snapshot=str(save.with_suffix(".pickle")) if save else None)


@contextlib.contextmanager
def _stdout_to_stderr():
    """Everything written to stdout while inside goes to stderr: Python's sys.stdout, logging handlers that hold the
    original stdout (DeepSpeed's logger), and C code writing to file descriptor 1; so --json's stdout is the JSON
    alone, whatever the libraries print while the run goes on."""
    originals = {id(s) for s in (sys.stdout, sys.__stdout__) if s is not None}
    for stream in (sys.stdout, sys.__stdout__):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:                                    # no file descriptor 1 to swap: Python-level only
        saved = None
    loggers = [logging.root, *(x for x in logging.root.manager.loggerDict.values() if isinstance(x, logging.Logger))]
    moved = [h for lg in loggers for h in lg.handlers
             if isinstance(h, logging.StreamHandler) and id(getattr(h, "stream", None)) in originals]
    streams = [h.setStream(sys.stderr) for h in moved]
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        for h, stream in zip(moved, streams):
            h.setStream(stream)
        for stream in (sys.stdout, sys.__stdout__):
            with contextlib.suppress(Exception):
                stream.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


if __name__ == "__main__":
    sys.exit(main())
