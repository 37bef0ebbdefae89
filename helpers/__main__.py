"""Command line: `python -m helpers estimate --model llama-3-8b --strategy zero2 ...` (see --help).

Prints a table in GiB (2**30 bytes), or with --json the Result object (and nothing else on stdout: what libraries
print while it runs goes to stderr). Exit status: 0 a result; 2 bad input, with one line `error: ...` naming the
bad value and what is allowed; 1 a measurement or a save that failed (its message says why); 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import re
import sys
from pathlib import Path

from helpers.errors import InputError, MeasurementError
from helpers.training import FACES, TrainSetup, with_applicable


class Parser(argparse.ArgumentParser):
    """argparse with no abbreviations, and usage errors as one line `error: ...` (exit 2), not the usage block."""

    argv: list[str] = []                           # the words being parsed (main sets them), for error hints

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
        elif m := re.match(r"argument (\S+?)(?:/\S+)?: expected one argument", message):
            given = next((w for k, w in zip(self.argv, self.argv[1:]) if k == m.group(1) and w.startswith("-")), None)
            message += (f" (got {given!r}, which starts with '-' and is read as a flag: write {m.group(1)}={given})"
                        if given else "")
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


# Set-up flags, one per TrainSetup field, generated from the fields' Faces (helpers.training.Face). Their defaults are
# left out of the namespace (argparse.SUPPRESS), so that the flags a user typed are known: they override what --from
# files say; the others come from the files, or from TrainSetup's defaults (which the help texts name).
S = argparse.SUPPRESS


class _Flag(argparse.Action):
    """Stores a set-up flag's value and which spelling was typed (`typed_flags`: field -> flag), so an override is
    reported under the flag the user wrote (--no-pin-memory, --grad-checkpointing)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)
        namespace.typed_flags = getattr(namespace, "typed_flags", {}) | {self.dest: option_string}


def _flag_argument(p, name: str, f, default) -> None:
    """The flag(s) of one field: a switch, a switch pair, a choice, or an integer / number / text value."""
    help_ = f.help() if callable(f.help) else f.help
    kind = str(next(x.type for x in dataclasses.fields(TrainSetup) if x.name == name))
    switch = dict(dest=name, action=_Flag, nargs=0, default=S)
    if "bool" in kind:
        if f.negative:
            pair = p.add_mutually_exclusive_group()
            pair.add_argument(f.flag, const=True, help=f"{help_} (default {'on' if default else 'off' if default is False else 'unset'})",
                              **switch)
            pair.add_argument(f.negative, const=False, **switch)
        else:
            p.add_argument(f.flag, const=True, help=help_, **switch)
        return
    choices = f.choices() if callable(f.choices) else f.choices
    text = "; ".join(x for x in (help_, "" if default is None else f"default {default}") if x)
    target = p
    if f.alias is not None:                          # --grad-checkpointing, another spelling of --checkpointing full
        target = p.add_mutually_exclusive_group()
        target.add_argument(f.alias[0], const=f.alias[1], help=f.alias[2], **switch)
    if choices is not None:
        target.add_argument(f.flag, dest=name, action=_Flag, default=S, metavar="{" + ",".join(choices) + "}",
                            help=text or None)
        return
    typ = integer if "int" in kind else number if "float" in kind else str
    target.add_argument(f.flag, dest=name, action=_Flag, type=typ, default=S, metavar=f.metavar, help=text or None)


def setup_parser(p: argparse.ArgumentParser) -> None:
    """The set-up flags shared by every sub-command (a flag given overrides what --from files say)."""
    p.add_argument("--from", dest="from_files", action="append", default=None, metavar="FILE",
                   help="read the set-up from your training config (DeepSpeed JSON, axolotl / LLaMA-Factory / TRL / "
                        "accelerate / torchtune / LitGPT YAML, torchtitan TOML, OpenRLHF command line); repeat for a "
                        "companion file. "
                        "Flags given beside it override what the files say, and are listed as overrides")
    p.add_argument("--model", default=None,
                   help="catalogue name or hub id (see `models`, e.g. Qwen/Qwen3-4B), or the path of a config.json; "
                        "needed unless --from files name a model the catalogue knows")
    defaults = TrainSetup()
    for name, f in FACES.items():
        if f.flag is None:
            continue
        if name == "gpu_gib":                         # a capacity, or a preset that gives one (and its CUDA context)
            cap = p.add_mutually_exclusive_group()
            _flag_argument(cap, name, f, None)
            cap.add_argument("--gpu", default=None, metavar="NAME", help="a GPU preset: the memory CUDA gives a process "
                             "on it (a little under nvidia-smi's total) and its CUDA context (see helpers.gpus)")
            continue
        _flag_argument(p, name, f, getattr(defaults, name))
    p.add_argument("--offline", action="store_true",
                   help="never download: a hub id the catalogue does not know is read from the Hugging Face cache or "
                        "refused (HF_HUB_OFFLINE=1 does the same); without it, its config.json alone is fetched from "
                        "the Hub, and the output says so")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--items", action="store_true", help="also list every named buffer behind the figures")


def flags() -> dict[str, str]:
    """Each flag -> the TrainSetup field it sets (every spelling)."""
    out = {}
    for name, f in FACES.items():
        for flag in (f.flag, f.negative, f.alias[0] if f.alias else None):
            if flag:
                out[flag] = name
    return out | {"--gpu": "gpu_gib"}


def given(a: argparse.Namespace) -> dict:
    """The TrainSetup fields the user typed a flag for, with their values ({} when none): the overrides."""
    out = {name: getattr(a, name) for name in FACES if hasattr(a, name) and name != "gpu_gib"}
    if getattr(a, "gpu", None) is not None or hasattr(a, "gpu_gib"):
        out["gpu_gib"] = _gpu_gib(a)
    return out


def setup_from_args(a: argparse.Namespace, base: TrainSetup | None = None) -> TrainSetup:
    """The set-up: `base` (what --from files say, else TrainSetup's defaults) with the flags given in place; a value
    the flags did not give goes back to its default where it no longer applies (a file's every-Nth-layer
    checkpointing under --checkpointing none)."""
    typed = given(a)
    setup = with_applicable(dataclasses.replace(base or TrainSetup(), **typed), keep=typed).validate()
    for name, what in ZERO3_ONLY.items():      # the default value, typed: not dropped silently under another strategy
        if typed.get(name) and setup.strat.family != "zero3":
            from helpers import strategies

            raise InputError(f"{_flag_of(a, name)} ({what}) is a ZeRO-3 option: use it with --strategy "
                             f"{strategies.listing(lambda x: x.family == 'zero3', 'or')}, got {setup.strategy!r}")
    return setup


ZERO3_ONLY = {"zero3_init": "the model built already partitioned under deepspeed.zero.Init",
              "save_16bit": "the whole 16-bit model gathered on rank 0 at a save"}
"""Flags whose typed value is the default and means something under ZeRO-3 alone (their False is refused by
TrainSetup itself)."""


def _gpu_gib(a: argparse.Namespace) -> float | None:
    """--gpu-gib, or the capacity of the --gpu preset (what CUDA gives a process, in GiB: helpers.gpus.preset)."""
    if getattr(a, "gpu", None) is None:
        return getattr(a, "gpu_gib", None)
    from helpers import gpus
    return gpus.preset(a.gpu)["gib"]


def imported_from(a: argparse.Namespace):
    """(model, set-up, Imported or None, overrides): --from files read by helpers.readers, the flags given in place.
    Each override says which flag replaced which value, and where that value came from (file:line or a default)."""
    if not getattr(a, "from_files", None):
        if a.model is None:
            raise InputError("the following arguments are required: --model (a catalogue name, hub id or config.json "
                             "path), or --from FILE that names a model the catalogue knows")
        return a.model, setup_from_args(a), None, []
    from helpers import readers

    imp = readers.read(a.from_files, model=a.model)
    if a.model is None and imp.model is None:
        named = (f" (they name {imp.model_named!r}, which is neither in the catalogue nor in the Hugging Face cache, "
                 f"nor downloadable here)" if imp.model_named else "")
        raise InputError(f"--from {' '.join(a.from_files)} names no model the catalogue knows{named}: pass --model "
                         f"(a catalogue name, hub id or config.json path)")
    overrides = []
    typed = given(a)
    from helpers.readers.provenance import GPUS_UNKNOWN_TOOL

    unknown_world = any(d.key == "gpus" and d.tool == GPUS_UNKNOWN_TOOL for d in imp.defaults)
    if unknown_world and typed.get("gpus", 1) > 1 and imp.setup.strategy == "single" and "strategy" not in typed:
        # files that name no launcher, run on N GPUs: N data-parallel processes (accelerate launch / torchrun), or
        # the tool's own distributed engine (torchtune's distributed recipes: FSDP2)
        from helpers import strategies

        kept = imp.setup.adapter_dtype if strategies.get(imp.more_gpus).adapter_dtype else None
        imp.setup = imp.setup.replace(strategy=imp.more_gpus, adapter_dtype=kept)   # (under FSDP2 the engine's)
        overrides.append({"flag": _flag_of(a, "gpus"), "field": "strategy", "value": imp.more_gpus,
                          "replaced": "single",
                          "from": "the files name no launcher or engine: on N GPUs the Trainer runs as N DDP "
                                  "processes (accelerate launch, torchrun)" if imp.more_gpus == "ddp" else
                                  f"the files leave the world size to the launcher: on N GPUs {imp.format} runs "
                                  f"{imp.more_gpus}"})
    _split_train_batch(a, imp, typed, overrides)
    if "versions" in typed:                 # a flag's releases join the file's (per library, the flag's win)
        from helpers import versions

        typed["versions"] = a.versions = versions.merged(imp.setup.versions, typed["versions"])
    for field, value in typed.items():
        old = getattr(imp.setup, field)
        if old == value and not (field == "gpus" and unknown_world):     # (a world the files leave out, given)
            continue
        overrides.append({"flag": _flag_of(a, field), "field": field, "value": value, "replaced": old,
                          "from": _origin(imp, field)})
    if a.model is not None and a.model != imp.model:
        replaced = imp.model or (f"{imp.model_named} (not found here)" if imp.model_named else None)
        overrides.append({"flag": "--model", "field": "model", "value": a.model, "replaced": replaced,
                          "from": _origin(imp, "model") if imp.model_named else "the files name no model"})
    setup = setup_from_args(a, imp.setup)
    for field in FACES:                     # what the flags changed besides themselves (helpers.training with_applicable)
        old, new = getattr(imp.setup, field), getattr(setup, field)
        if field not in typed and old != new:
            overrides.append({"flag": "(follows the flags)", "field": field, "value": new, "replaced": old,
                              "from": _origin(imp, field), "implied": True})
    return a.model or imp.model, setup, imp, overrides


def _split_train_batch(a, imp, typed: dict, overrides: list) -> None:
    """DeepSpeed's train_batch_size = micro batch x accumulation x world size: where the files gave the whole
    (`imp.per_world`, split over a world of 1) and the flags give the world or the micro batch, the one neither gives
    is derived again, said as an override; both given must multiply to the file's total."""
    pw = imp.per_world
    if not pw:
        return
    n = typed.get("gpus", imp.setup.gpus)
    if "batch" in typed and "grad_accum" in typed:
        if typed["batch"] * typed["grad_accum"] * n != pw["total"]:
            raise InputError(f"--batch {typed['batch']} x --grad-accum {typed['grad_accum']} x {n} GPU(s) is not the "
                             f"file's train_batch_size {pw['total']}, as DeepSpeed requires: change one, or the file")
        return
    if not {"gpus", "batch"} & set(typed):
        return
    derive = "grad_accum" if "batch" in typed else "batch" if "grad_accum" in typed else pw["field"]
    keep = "batch" if derive == "grad_accum" else "grad_accum"
    other = typed.get(keep, getattr(imp.setup, keep))
    value, rest = divmod(pw["total"], other * n)
    other_name, derived_name = ("micro batch", "accumulation") if keep == "batch" else ("accumulation", "micro batch")
    if value < 1 or rest:
        flag = "--batch" if keep == "batch" else "--grad-accum"
        raise InputError(f"train_batch_size {pw['total']} is not {other_name} {other} x {n} GPU(s) x a whole "
                         f"{derived_name}, as DeepSpeed requires: choose --gpus and {flag} whose product divides "
                         f"{pw['total']}")
    overrides.append({"flag": _flag_of(a, "gpus" if "gpus" in typed else "batch"), "field": derive, "value": value,
                      "replaced": getattr(imp.setup, derive),
                      "from": f"train_batch_size {pw['total']} split again: {pw['total']} / ({other_name} {other} x "
                              f"{n} GPU(s))"})
    imp.setup = imp.setup.replace(**{derive: value})


def _flag_of(a, field: str) -> str:
    """The flag the user typed for `field`."""
    if field == "gpu_gib" and getattr(a, "gpu", None) is not None:
        return "--gpu"
    return getattr(a, "typed_flags", {}).get(field, FACES[field].flag)


def _origin(imp, field: str) -> str:
    """Where the files' value of `field` came from: 'FILE:LINE (key)', 'default (tool)', or the package's default."""
    for x in imp.settings:
        if field in x.fields or (field == "model" and x.sets.startswith("model")):
            return f"{x.file}:{x.line} ({x.key})" if x.line else f"{x.file} ({x.key})"
    for d in imp.defaults:
        if field in d.fields:
            return f"default ({d.tool}: {d.key})"
    return "this package's default (the files do not set it)"


def read_flags(words: list[str]):
    """(model, TrainSetup) from set-up flags as the CLI reads them (`--from FILE`, `--model`, `--strategy` ...):
    what a notebook or a test gives `explain` for a set-up written as flags; InputError for a bad flag."""
    p = Parser(prog="flags")
    setup_parser(p)
    Parser.argv = list(words)
    try:
        a = p.parse_args(list(words))
    except SystemExit:                                     # Parser.error printed the one line already
        raise InputError(f"bad set-up flags: {' '.join(words)[:200]}") from None
    model, setup, _, _ = imported_from(a)
    return model, setup


def main(argv=None) -> int:
    if sys.stdout is None:                     # started with stdout closed (`>&-`): nothing could be said there
        if sys.stderr is not None:
            print("error: standard output is closed: nothing can be written (give it a file or a pipe)",
                  file=sys.stderr)
        return 1
    parser = Parser(prog="python -m helpers", description="LLM training memory, per phase, in GiB.")
    sub = parser.add_subparsers(dest="command", required=True)
    setup_parser(sub.add_parser("estimate", help="analytic estimate (no tensors: milliseconds per set-up; a command "
                                                 "takes a few seconds, mostly importing torch and transformers)"))
    measure = sub.add_parser("measure", help="measured memory: dry-run (full size, fake tensors), scaled (tiny twin, "
                                             "real, this CPU)")
    setup_parser(measure)
    measure.add_argument("--mode", default="scaled", choices=["dry-run", "scaled", "gpu"],
                         help="scaled (default): the tiny twin trained for real on this CPU through the set-up's engine; "
                              "dry-run: the full-size step on fake tensors; gpu: the full-size step on CUDA")
    measure.add_argument("--steps", type=integer, default=3, help="scaled: training steps (default 3, at most 1000)")
    measure.add_argument("--save", metavar="PATH", default=None,
                         help="also write the result as JSON (atomically), e.g. data/results/NAME.json; with "
                              "--mode dry-run or gpu, a memory snapshot in PyTorch's format beside it (PATH with "
                              ".pickle: the allocator model's at its out-of-memory or peak, or the GPU's own)")
    measure.add_argument("--no-progress", action="store_true", help="no progress bar")
    measure.add_argument("--alloc-conf", default=None, metavar="SETTINGS",
                         help="dry-run: the caching allocator's settings as PYTORCH_CUDA_ALLOC_CONF takes them, e.g. "
                              "expandable_segments:True (default: PyTorch's defaults)")
    fit = sub.add_parser("fit", help="the largest micro batch and the longest sequence that fit the capacities "
                                      "(--gpu-gib/--gpu, --host-gib), by search over the estimate")
    setup_parser(fit)
    fit.add_argument("--vary", choices=["batch", "seq"], action="append", default=None,
                     help="what to find the largest of (default both; repeatable)")
    setup_parser(sub.add_parser("fixes", help="every single change that could make the set-up fit, with its new "
                                              "peak and its cost (host RAM, pinned RAM, step time), ranked"))
    explain = sub.add_parser("explain", help="explain a pasted out-of-memory error (torch's message, a traceback, "
                                             "DeepSpeed's see_memory_usage, nvidia-smi, a host kill) against an "
                                             "estimate of the run: the phase, what the request was, the way out")
    setup_parser(explain)
    explain.add_argument("--message", metavar="FILE",
                         help="the text to explain: a file with the error as the log printed it, or - to read it "
                              "from standard input (paste, then Ctrl-D)")
    explain.add_argument("--snapshot", metavar="FILE",
                         help="a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot's pickle, read without "
                              "running anything in it; or `measure --mode dry-run --save X`'s X.pickle): its "
                              "blocks named, its out-of-memory placed")
    sub.add_parser("models", help="list the model catalogue")
    try:
        try:
            Parser.argv = list(sys.argv[1:] if argv is None else argv)
            a = parser.parse_args(argv)
        except SystemExit as exc:                      # a usage error (one line, said) or --help
            return exc.code if isinstance(exc.code, int) else 2
        return _run(a)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:          # the reader of a pipe left (`| head`): no traceback, and none at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:             # the output cannot be written: a full disk, a closed stdout (`>&-`)
        try:
            print(f"error: the output could not be written ({e.strerror or e})", file=sys.stderr)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def model_source(model) -> dict | None:
    """Where a hub id's config came from, when it is not a catalogue model: {'hub_id', 'config' (the Hugging Face
    cache or a download), 'same_shapes_as' (a catalogue model with the same parameters, or None)}; None otherwise."""
    from helpers import hub, models

    repo = models.hub_repo_of(model) or str(model)
    where = hub.origin(repo)
    if where is None:
        return None
    return {"hub_id": repo, "config": where, "same_shapes_as": models.same_shapes_as(model)}


def model_notes(a: argparse.Namespace, imported) -> str | None:
    """What the model's own checkpoint holds that the estimate leaves out: a pre-quantised config's weights, and the
    vision tower of a --model hub id naming a multimodal checkpoint (a --from file's own hub id is listed with its
    not-modelled settings instead)."""
    from helpers import models

    named = getattr(a, "model", None)
    model = named or (imported.model if imported is not None else None)
    base = getattr(a, "base_weights", None) or (imported.setup.base_weights if imported is not None else None)
    notes = [models.quantization_note(model, base) if model else None]
    if named and not (imported is not None and imported.model_named == named):
        notes.append(models.tower_note(named))
    return "\n".join(f"not modelled: {n}" for n in notes if n) or None


def model_source_line(src: dict) -> str:
    same = f"; the same parameters as catalogue model {src['same_shapes_as']}" if src["same_shapes_as"] else ""
    return f"model {src['hub_id']}: config.json from {src['config']}{same}"


def _run(a: argparse.Namespace) -> int:
    """The command, with a hub id's config.json downloadable unless --offline (helpers.hub; only for this call)."""
    from helpers import hub

    offline = getattr(a, "offline", False)
    with hub.downloads(not offline, "--offline forbids a download" if offline else None):
        return _command(a)


def _rank() -> int:
    """This process's rank under a launcher (RANK), 0 without one; InputError for a RANK that is not a whole number."""
    text = os.environ.get("RANK", "0").strip() or "0"
    try:
        rank = int(text)
    except ValueError:
        rank = -1
    if rank < 0:
        raise InputError(f"RANK={text[:40]!r} in the environment must be a whole number >= 0 (a launcher's process "
                         f"rank; unset it to run alone)")
    return rank


def _command(a: argparse.Namespace) -> int:
    try:
        rank = _rank()
        world = os.environ.get("WORLD_SIZE", "").strip()
        launched = world.isdigit() and int(world) > rank          # a launcher sets RANK and WORLD_SIZE together
        if rank != 0 and a.command in ("estimate", "fit", "fixes"):
            if launched:
                return 0                               # under a launcher, rank 0 answers (arithmetic: the same)
            print(f"note: RANK={rank} without a WORLD_SIZE above it: not under a launcher, so this process answers "
                  f"(unset RANK to silence this)", file=sys.stderr)
        if getattr(a, "gpu", None) is not None:
            from helpers import gpus

            a.gpu = gpus.canonical(a.gpu)            # 'H100', 'RTX 4090', 'Tesla T4' ... as their preset names
        if a.command == "models":
            from helpers import models
            for name in models.catalogue():
                print(f"{name:20s} {models.spec(name).params:>18,d} parameters  {models.hub_id(name) or ''}")
            return 0
        save = None
        if a.command == "measure" and a.save is not None:
            from helpers.results import check_save_path
            save = check_save_path(a.save)              # before the run: a bad path must not cost the measurement
        if a.command in ("fit", "fixes"):
            return _answer(a)
        if a.command == "explain":
            return _explain(a)
        with _stdout_to_stderr() if a.json else contextlib.nullcontext():
            result, imported, overrides = _result(a, save)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except MeasurementError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if rank != 0 and launched:                         # under a launcher, rank 0 reports
        return 0
    from helpers import evidence, report

    src = model_source(result.model)
    tower = model_notes(a, imported)
    unmodelled = report.unmodelled_caution(result, imported)
    world = report.world_caution(result.setup, imported, overrides)
    if a.json:
        doc = result.to_dict() | {"evidence": {"kind": evidence.kind(result), "detail": evidence.detail(result)}}
        if imported is not None:
            doc["imported"] = imported.to_json() | {"overrides": overrides}
        if src is not None:
            doc["model_source"] = src
        caution = report.reserve_caution(result)
        if caution:
            doc["reserve_caution"] = caution
        if tower:
            doc["not_modelled_model"] = tower
        if unmodelled:
            doc["unmodelled_caution"] = unmodelled
        if world:
            doc["world_caution"] = world
        print(json.dumps(doc, indent=1, default=str), flush=True)
    else:
        if imported is not None:
            print(report.imported_table(imported, overrides) + "\n", flush=True)
        if src is not None:
            print(model_source_line(src), flush=True)
        if tower:
            print(tower, flush=True)
        print(report.table(result), flush=True)
        if unmodelled:
            print(unmodelled, flush=True)
        if world:
            print(world, flush=True)
    if a.items and not a.json:
        print("\n" + report.items_table(result))
    if save is not None:
        try:
            from helpers import evidence

            result.save(save, {"evidence": {"kind": evidence.kind(result), "detail": evidence.detail(result)}})
        except (InputError, OSError) as exc:           # the result is printed above: only the file is missing
            print(f"error: the result was not saved to {str(save)!r}: {exc}", file=sys.stderr)
            return 1
    return 0


def _answer(a: argparse.Namespace) -> int:
    """`fit` and `fixes`: the answer as text (the provenance table first when --from), or one JSON object."""
    from helpers import estimate, fit, fixes, report

    try:
        model, setup, imported, overrides = imported_from(a)
        base = estimate.run(model, setup)
        if a.gpu:
            base.meta["gpu_preset"] = a.gpu
        doc = {"model": base.model, "params": base.params, "setup": base.setup, "verdict": report.verdict(base)}
        if a.command == "fit":
            answers = [fit.largest(model, setup, v, gpu=a.gpu) for v in (a.vary or ["batch", "seq"])]
            doc["fit"] = [f.to_json() for f in answers]
            text = "\n".join(fit.table(f) for f in answers)
        else:
            skipped: list = []
            ways = fixes.ways_out(model, setup, gpu=a.gpu, skipped=skipped)
            from helpers import step_cost
            doc |= {"ways": [w.to_json() for w in ways], "skipped": [{"name": n, "why": w} for n, w in skipped],
                    "rates": step_cost.rates().sources}
            text = (fixes.table(ways) + "\n\nnot tried (the strategy or set-up does not allow them):\n"
                    + "\n".join(f"  {n}: {w}" for n, w in skipped) + f"\n\nrates: {step_cost.rates().sources}")
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if imported is not None:
        doc["imported"] = imported.to_json() | {"overrides": overrides}
    src = model_source(model)
    if src is not None:
        doc["model_source"] = src
    caution = report.reserve_caution(base)
    if caution:
        doc["reserve_caution"] = caution
        text = f"as given: {caution}\n" + text
    tower = model_notes(a, imported)
    if tower:
        doc["not_modelled_model"] = tower
    unmodelled = report.unmodelled_caution(base, imported, any_verdict=True)
    if unmodelled:
        doc["unmodelled_caution"] = unmodelled
        text = f"{unmodelled}\n{text}"
    if a.json:
        print(json.dumps(doc, indent=1, default=str), flush=True)
        return 0
    if tower:
        text = tower + "\n" + text
    if src is not None:
        text = model_source_line(src) + "\n" + text
    head = f"{base.model}: {setup.strategy} on {setup.gpus} GPU(s), batch {setup.batch}{report.pairs_word(setup)} x seq {setup.seq}; as given: " \
           f"{doc['verdict']}   [estimate; GiB = 2^30 bytes]"
    print((report.imported_table(imported, overrides) + "\n\n" if imported is not None else "") + head + "\n" + text,
          flush=True)
    return 0


def _explain(a: argparse.Namespace) -> int:
    """`explain`: the pasted text read and placed against the run's estimate (without --from or --model, the
    message alone), as text or one JSON object."""
    from helpers import explain, report

    if a.message is None and a.snapshot is None:
        raise InputError("explain needs --message FILE (the error as the log printed it; - for standard input) or "
                         "--snapshot FILE (a memory snapshot pickle), or both")
    from helpers import snapshots

    text = None if a.message is None else _message_text(a.message)
    snap = None if a.snapshot is None else snapshots.load(a.snapshot)
    model = setup = imported = None
    overrides: list = []
    if getattr(a, "from_files", None) or a.model is not None:
        model, setup, imported, overrides = imported_from(a)
    ex = explain.explain(text, model, setup, gpu=a.gpu, snapshot=snap)
    world = report.world_caution(dataclasses.asdict(setup), imported, overrides) if setup is not None else None
    if a.json:
        doc = ex.to_json()
        if imported is not None:
            doc["imported"] = imported.to_json() | {"overrides": overrides}
        if world:
            doc["world_caution"] = world
        print(json.dumps(doc, indent=1, default=str), flush=True)
        return 0
    head = report.imported_table(imported, overrides) + "\n\n" if imported is not None else ""
    print(head + ex.text() + (f"\n{world}" if world else ""), flush=True)
    return 0


MAX_MESSAGE_BYTES = 20_000_000


def _tail(name: str, path, data: bytes) -> bytes:
    """The last MAX_MESSAGE_BYTES of a file (read from its end) or of standard input's bytes, from a line's start."""
    if path is not None:
        with Path(path).open("rb") as f:
            f.seek(-MAX_MESSAGE_BYTES, os.SEEK_END)
            data = f.read()
    else:
        data = data[-MAX_MESSAGE_BYTES:]
    cut = data.find(b"\n")
    return data[cut + 1:] if 0 <= cut < 10_000 else data


def _message_text(name: str) -> str:
    """The text of --message: a file, or standard input for '-'; InputError naming what is wrong with it."""
    path = None
    if name == "-":
        if sys.stdin is None:
            raise InputError("--message - reads standard input, which is closed: give a file")
        buf = bytearray()                              # kept bounded: the end of a long pipe is what counts
        while chunk := sys.stdin.buffer.read(1 << 20):
            buf += chunk
            if len(buf) > 2 * MAX_MESSAGE_BYTES:
                del buf[:len(buf) - MAX_MESSAGE_BYTES - 1]
        data = bytes(buf)
    else:
        path = Path(name)
        if not path.is_file():
            raise InputError(f"--message {name!r} is not a file (give the log or error text as a file, or - for "
                             f"standard input)")
        try:
            with path.open("rb") as f:
                data = f.read(MAX_MESSAGE_BYTES + 1)          # over the limit: its end is read again below
        except OSError as e:
            raise InputError(f"--message {name!r} could not be read: {e.strerror or e}") from None
    if len(data) > MAX_MESSAGE_BYTES:                 # a whole log: the error is at its end
        print(f"note: --message {name!r} is over {MAX_MESSAGE_BYTES:,} bytes: its last {MAX_MESSAGE_BYTES:,} are "
              f"read (where a run's error is)", file=sys.stderr)
        data = _tail(name, path if name != "-" else None, data)
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):           # UTF-16 with its mark (Windows PowerShell's '>')
        return data.decode("utf-16", errors="replace")
    if b"\0" in data[:8192]:
        raise InputError(f"--message {name!r} is binary, not text (a memory snapshot pickle goes to --snapshot; "
                         f"a UTF-16 log without its byte-order mark: save it as UTF-8)")
    return data.decode("utf-8-sig", errors="replace")


def _result(a: argparse.Namespace, save: Path | None):
    """(the Result, the Imported of --from files or None, the overrides)."""
    model, setup, imported, overrides = imported_from(a)
    return _measured(a, save, model, setup), imported, overrides


def _measured(a: argparse.Namespace, save: Path | None, model, setup):
    from helpers import estimate

    if a.command != "measure":
        r = estimate.run(model, setup)
        if getattr(a, "gpu", None):
            r.meta["gpu_preset"] = a.gpu         # the verdict counts the preset's CUDA context and NCCL, as fit does
        return r
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
        return dryrun.run(model, setup, progress=not a.no_progress, gpu=a.gpu, alloc_conf=a.alloc_conf,
                          snapshot=save.with_suffix(".pickle") if save else None)
    if a.mode == "scaled":
        from helpers.measure import scaled
        return scaled.run(model, setup, steps=a.steps, progress=not a.no_progress)
    from helpers.measure import gpu
    return gpu.run(model, setup, snapshot=str(save.with_suffix(".pickle")) if save else None)


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
