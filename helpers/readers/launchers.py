"""The world size a launch line gives, read as the launchers' own argparse parsers read it: deepspeed's
(launcher/runner.py: --num_gpus/--num_accelerators, --num_nodes, --include/--exclude, CUDA_VISIBLE_DEVICES) and
torchrun's (--nproc-per-node, --nnodes), abbreviations included."""

from __future__ import annotations

import functools
import re

from helpers.readers import shell
from helpers.readers.base import ConfigError, did_you_mean
from helpers.readers.provenance import argparse_int as positive_int


@functools.cache
def flags_of(which: str) -> frozenset[str]:
    """The flags of the installed launcher's own argparse parser: deepspeed's (launcher/runner.py, read from its
    source) or torchrun's (torch.distributed.run.get_args_parser)."""
    if which == "torchrun":
        from torch.distributed.run import get_args_parser

        return frozenset(k for k in get_args_parser()._option_string_actions if k.startswith("--"))
    import inspect

    import deepspeed.launcher.runner as runner

    src = inspect.getsource(runner)
    return frozenset(re.findall(r'"(--[\w-]+)"', "\n".join(re.findall(r"add_argument\(([^)]*)", src))))


def launcher_of(words: list[str]) -> tuple[str | None, int]:
    """('deepspeed' or 'torchrun', the index of its word) of the launcher among a command's words (also as
    `python -m deepspeed.launcher.runner` / `torch.distributed.run` and by path), or (None, -1)."""
    for k, w in enumerate(words):
        base = str(w).rsplit("/", 1)[-1]
        if base == "deepspeed" or base == "deepspeed.launcher.runner":
            return "deepspeed", k
        if base in ("torchrun", "torch.distributed.run", "torch.distributed.launch"):
            return "torchrun", k
    return None, -1


def unabbreviated(words: list[str]) -> list[str]:
    """The launcher's words with each abbreviated flag written whole, as its argparse (allow_abbrev) reads it:
    `deepspeed --num_gpu 4` is --num_gpus 4, `torchrun --nproc_per 4` is --nproc_per_node 4."""
    which, at = launcher_of(words)
    if which is None:
        return words
    known = flags_of(which)
    out = list(words[:at + 1])
    for w in words[at + 1:]:
        name, eq, rest = w.partition("=")
        if name.startswith("--") and name not in known:
            matches = [k for k in known if k.startswith(name)]
            if len({m.replace("-", "_") for m in matches}) == 1:
                w = matches[0] + eq + rest
        out.append(w)
    return out


def _environment(launcher: list[str], env: dict) -> dict:
    """What the launcher sees of the environment: the command's own (exported variables, NAME=value prefixes),
    changed by an `env` before it as env does (-i / --ignore-environment empties it, -u NAME / --unset=NAME drops one,
    NAME=value sets one)."""
    out = dict(env)
    k = next((i for i, w in enumerate(launcher) if str(w).rsplit("/", 1)[-1] == "env"), None)
    if k is None:
        return out
    k += 1
    while k < len(launcher):
        w = str(launcher[k])
        if w in ("-i", "--ignore-environment", "-"):
            out = {}
        elif w in ("-u", "--unset") and k + 1 < len(launcher):
            out.pop(str(launcher[k + 1]), None)
            k += 1
        elif w.startswith("--unset="):
            out.pop(w.split("=", 1)[1], None)
        elif re.fullmatch(r"[A-Za-z_]\w*=.*", w, re.S):
            n, _, v = w.partition("=")
            out[n] = v
        elif not w.startswith("-"):
            break
        k += 1
    return out


def world_size(path, launcher: list[str], env: dict) -> tuple[int | None, object]:
    """World size from the launcher's own flags (deepspeed --num_gpus/--num_nodes/--include/--exclude and
    CUDA_VISIBLE_DEVICES as its runner reads them, torchrun --nproc_per_node/--nnodes); `launcher` is the command's
    words before the module, as bash expands them, and `env` what the command sees of the environment."""
    which, at = launcher_of(launcher)
    words = unabbreviated(list(launcher))[at + 1:] if which else []
    if which == "deepspeed":                       # deepspeed's own argparse stops at a flag it does not have
        known = flags_of("deepspeed")
        for w in words:
            name = w.partition("=")[0]
            if name.startswith("--") and name not in known:
                starts = sorted({k for k in known if k.startswith(name)})
                if name == "--":
                    raise ConfigError(path, "'--' ends the deepspeed launcher's own flags: what follows it (--module) "
                                            "is taken as the script to run, and the run fails")
                if len(starts) > 1:
                    raise ConfigError(path, f"{name} is an ambiguous abbreviation for the deepspeed launcher "
                                            f"(argparse: 'ambiguous option: {name} could match "
                                            f"{', '.join(starts[:4])}'); write the whole flag")
                raise ConfigError(path, f"the deepspeed launcher has no flag {name} (its argparse stops: "
                                        f"'unrecognized arguments')" + did_you_mean(name, sorted(known), 0.7))

    def value(*names):
        found = None                                # argparse keeps a flag's last value
        for k, w in enumerate(words):
            for n in names:
                got = words[k + 1] if w == n and k + 1 < len(words) else w if w.startswith(n + "=") else None
                if isinstance(got, (shell.Unknown, shell.Unset)):
                    raise ConfigError(path, f"the launcher's {n} {got!s}: {got.why}, so its GPU count is not known "
                                            f"here; assign it plainly before the command, or give --gpus")
                if got is not None:
                    found = got if w == n else w.split("=", 1)[1]
        return found
    deepspeed = which == "deepspeed"
    per_node = (value("--num_gpus", "--num_accelerators") if deepspeed else
                value("--nproc_per_node", "--nproc-per-node"))                                 # (runner.py's spellings)
    include, exclude = value("--include", "-i"), value("--exclude", "-e")
    nodes = value("--num_nodes", "--num-nodes", "--nnodes")
    visible = _environment(launcher, env).get("CUDA_VISIBLE_DEVICES")
    source = "--include"
    if deepspeed and visible is not None:
        if isinstance(visible, shell.Unknown):
            raise ConfigError(path, f"CUDA_VISIBLE_DEVICES, which the deepspeed launcher reads: {visible.why}; "
                                    f"assign it plainly, or give --gpus")
        def number(v):
            try:
                return int(v)
            except (TypeError, ValueError):
                return None
        # launcher/runner.py main(): a non-empty CUDA_VISIBLE_DEVICES becomes --include localhost:<it>, unless
        # --include/--exclude, --num_nodes > 1 or --num_gpus > 0 is given (then it is ignored)
        if len(visible) and not (include or exclude or (number(nodes) or 0) > 1 or (number(per_node) or 0) > 0):
            include, source = f"localhost:{visible}", f"CUDA_VISIBLE_DEVICES={visible} (which DeepSpeed's launcher " \
                                                      f"turns into --include localhost:{visible})"
    given = value("--num_gpus", "--num_accelerators") or value("--num_nodes")
    if deepspeed and given is not None and (include or exclude):
        raise ConfigError(path, f"the deepspeed launcher is given --num_gpus/--num_nodes and "
                                f"{'--include/--exclude' if source == '--include' else source}: it refuses the pair "
                                f"('Cannot specify num_nodes/gpus with include/exclude', launcher/runner.py); keep one")
    if per_node is None and include:              # localhost:0,1,2,3, or host1:0,1@host2:0,1,2 (DeepSpeed's hostfile
        hosts = include.split("@")                  # filter: every GPU it names, on each host it names)
        if all(":" in h for h in hosts):
            slots: dict[str, set[int]] = {}     # launcher/runner.py parse_node_config_list: int slots, merged per host
            for h in hosts:
                name, _, listed = h.partition(":")
                for g in listed.split(","):
                    try:
                        slot = int(g)
                    except ValueError:
                        raise ConfigError(path, f"{source if source != '--include' else '--include ' + include}: "
                                                f"DeepSpeed's launcher reads each GPU of a host as a number "
                                                f"(launcher/runner.py parse_node_config: int(slot)), so {g!r} stops "
                                                f"it; list them, e.g. localhost:0,1,2,3") from None
                    if slot < 0:
                        raise ConfigError(path, f"{source if source != '--include' else '--include ' + include}: "
                                                f"GPU {slot} is no GPU of {name} (DeepSpeed's launcher: 'No slot "
                                                f"{slot!r} specified on host')")
                    slots.setdefault(name, set()).add(slot)
            counts = [len(v) for v in slots.values()]
            hosts = list(slots)
            if len(hosts) > 1:
                return sum(counts), (f"launcher: --include names {sum(counts)} GPUs on {len(hosts)} hosts "
                                     f"({', '.join(map(str, counts))})")
            per_node = str(counts[0])
    if per_node is None:
        excluded = exclude
        return None, (("--exclude", excluded, "the GPUs left are the machine's less these, and the script does not "
                       "say how many the machine has") if excluded else "")
    if deepspeed and per_node is not None and str(per_node).strip() in ("-1", "0"):
        return None, ("--num_gpus", per_node, "every GPU of the node (DeepSpeed's runner takes -1 and 0 so), a count "
                                              "the script does not say")
    if per_node in ("gpu", "auto", "cpu", "xpu") or (nodes and ":" in nodes):
        return None, (("--nproc-per-node", per_node, "every GPU of the node (or an elastic node range), a count the "
                       "script does not say") if per_node in ("gpu", "auto") else
                      ("--nnodes", nodes, "an elastic node range, a count the script does not say"))
    n = positive_int(path, "the launcher's GPUs per node", per_node)
    m = positive_int(path, "the launcher's nodes", nodes) if nodes else 1
    return n * m, f"launcher: {n} GPU{'' if n == 1 else 's'} per node" + (f" x {m} nodes" if nodes else "")
