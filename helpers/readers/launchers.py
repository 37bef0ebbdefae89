"""The world size a launch line gives, read as the launchers' own argparse parsers read it: deepspeed's
(launcher/runner.py: --num_gpus/--num_accelerators, --num_nodes, --include/--exclude, CUDA_VISIBLE_DEVICES) and
torchrun's (--nproc-per-node, --nnodes), abbreviations included."""

from __future__ import annotations

import functools
import re
import shlex

from helpers.readers import shell
from helpers.readers.base import ConfigError, did_you_mean
from helpers.readers.provenance import positive_int


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


def unabbreviated(words: list[str]) -> list[str]:
    """The launcher's words with each abbreviated flag written whole, as its argparse (allow_abbrev) reads it:
    `deepspeed --num_gpu 4` is --num_gpus 4, `torchrun --nproc_per 4` is --nproc_per_node 4."""
    which = "deepspeed" if "deepspeed" in words else "torchrun" if any(
        w in ("torchrun", "torch.distributed.run") for w in words) else None
    if which is None:
        return words
    known = flags_of(which)
    out = []
    for w in words:
        name, eq, rest = w.partition("=")
        if name.startswith("--") and name not in known:
            matches = [k for k in known if k.startswith(name)]
            if len({m.replace("-", "_") for m in matches}) == 1:
                w = matches[0] + eq + rest
        out.append(w)
    return out


def world_size(path, launcher: list[str], script: str) -> tuple[int | None, object]:
    """World size from the launcher's own flags (deepspeed --num_gpus/--num_nodes/--include, torchrun
    --nproc_per_node/--nnodes), also on a separate `deepspeed --module $cmd` line of the script."""
    words = list(launcher)
    for line in re.sub(r"\\\r?\n", " ", shell.strip_comments(script)).splitlines():
        if re.match(r"\s*(deepspeed|torchrun)\b", line) and "$" in line:
            try:
                words += shlex.split(line, comments=True)
            except ValueError:
                pass

    words = unabbreviated(words)
    if "deepspeed" in launcher:                    # deepspeed's own argparse stops at a flag it does not have
        known = flags_of("deepspeed")
        for w in unabbreviated(list(launcher)):
            name = w.partition("=")[0]
            if name.startswith("--") and name not in known:
                raise ConfigError(path, f"the deepspeed launcher has no flag {name} (its argparse stops: "
                                        f"'unrecognized arguments')" + did_you_mean(name, sorted(known), 0.7))

    def value(*names):
        for k, w in enumerate(words):
            for n in names:
                if w == n and k + 1 < len(words):
                    return words[k + 1]
                if w.startswith(n + "="):
                    return w.split("=", 1)[1]
        return None
    per_node = (value("--num_gpus", "--num_accelerators") if "deepspeed" in words else         # (deepspeed's own
                value("--nproc_per_node", "--nproc-per-node"))                                 # spellings, runner.py)
    include = value("--include", "-i")
    visible = next((w.split("=", 1)[1] for w in launcher if w.startswith("CUDA_VISIBLE_DEVICES=")), None)
    if visible is None:
        visible = shell.assignments(shell.strip_comments(script)).get("CUDA_VISIBLE_DEVICES")
    if ("deepspeed" in words and visible and not isinstance(visible, shell.Unknown) and per_node is None and not include
            and not value("--exclude", "-e") and value("--num_nodes", "--num-nodes") is None):
        include = f"localhost:{visible}"   # launcher/runner.py: CUDA_VISIBLE_DEVICES becomes --include localhost:...
    nodes = value("--num_nodes", "--num-nodes", "--nnodes")
    given = value("--num_gpus", "--num_accelerators") or value("--num_nodes")
    if "deepspeed" in words and given is not None and (include or value("--exclude", "-e")):
        raise ConfigError(path, "the deepspeed launcher is given --num_gpus/--num_nodes and --include/--exclude: it "
                                "refuses the pair ('Cannot specify num_nodes/gpus with include/exclude', "
                                "launcher/runner.py); keep one")
    if per_node is None and include:              # localhost:0,1,2,3, or host1:0,1@host2:0,1,2 (DeepSpeed's hostfile
        hosts = include.split("@")                  # filter: every GPU it names, on each host it names)
        if all(":" in h for h in hosts):
            slots: dict[str, set[int]] = {}     # launcher/runner.py parse_node_config_list: int slots, merged per host
            for h in hosts:
                name, _, listed = h.partition(":")
                for g in listed.split(","):
                    try:
                        slots.setdefault(name, set()).add(int(g))
                    except ValueError:
                        raise ConfigError(path, f"--include {include}: DeepSpeed's launcher reads each GPU of a host "
                                                f"as a number (launcher/runner.py parse_node_config: int(slot)), so "
                                                f"{g!r} stops it; list them, e.g. localhost:0,1,2,3") from None
            counts = [len(v) for v in slots.values()]
            hosts = list(slots)
            if len(hosts) > 1:
                return sum(counts), (f"launcher: --include names {sum(counts)} GPUs on {len(hosts)} hosts "
                                     f"({', '.join(map(str, counts))})")
            per_node = str(counts[0])
    if per_node is None:
        excluded = value("--exclude", "-e")
        return None, (("--exclude", excluded, "the GPUs left are the machine's less these, and the script does not "
                       "say how many the machine has") if excluded else "")
    if per_node in ("gpu", "auto", "cpu", "xpu") or (nodes and ":" in nodes):
        return None, (("--nproc-per-node", per_node, "every GPU of the node (or an elastic node range), a count the "
                       "script does not say") if per_node in ("gpu", "auto") else
                      ("--nnodes", nodes, "an elastic node range, a count the script does not say"))
    n = positive_int(path, "the launcher's GPUs per node", per_node)
    m = positive_int(path, "the launcher's nodes", nodes) if nodes else 1
    return n * m, f"launcher: {n} GPU{'' if n == 1 else 's'} per node" + (f" x {m} nodes" if nodes else "")
