"""The process's one default process group: fake (dry runs) or gloo (real runs in this process), switched on demand."""

from __future__ import annotations

import os
import socket

_current: dict = {"kind": None, "world": None}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure(kind: str, world: int = 1) -> None:
    """Make the default process group `kind` ('fake', 'gloo' or 'nccl') of `world` ranks, this process rank 0
    (under torchrun or the deepspeed launcher, the launcher's rank and world are used instead)."""
    import torch.distributed as dist

    if _current == {"kind": kind, "world": world} and dist.is_initialized():
        return
    if dist.is_initialized():
        dist.destroy_process_group()
        _forget_cached_groups()
    if kind == "fake":
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    elif launched():
        dist.init_process_group(kind)
    else:
        os.environ.update(RANK="0", WORLD_SIZE=str(world), LOCAL_RANK="0", LOCAL_WORLD_SIZE=str(world),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group(kind, rank=0, world_size=world)
    _current.update(kind=kind, world=world)


def launched() -> bool:
    """Whether this process was started by torchrun or the deepspeed launcher."""
    return "TORCHELASTIC_RUN_ID" in os.environ or ("LOCAL_RANK" in os.environ and "MASTER_PORT" in os.environ
                                                   and int(os.environ.get("WORLD_SIZE", "1")) > 1)


def _forget_cached_groups() -> None:
    """DeepSpeed caches the groups it made (`deepspeed.utils.groups`); once the default group is destroyed they are
    stale ("Group ... is not registered"), so a later DeepSpeed run in this process must make them afresh."""
    import sys

    groups = sys.modules.get("deepspeed.utils.groups")
    if groups is None:
        return
    for name, value in list(vars(groups).items()):
        if name.startswith("_") and name.isupper() and name.endswith(("GROUP", "GROUP_RANKS")):
            setattr(groups, name, {} if isinstance(value, dict) else None)
