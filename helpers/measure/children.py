"""Child processes of a measurement (torchrun and its FSDP2 workers, the resume loads): started in a process group
of their own and ended with their parent, whatever way it exits.

- The parent ends them when the call returns, raises (a failure, a timeout, Ctrl-C: `KeyboardInterrupt`) or the
  interpreter exits (atexit): SIGTERM to the child's group and to every descendant (torchrun starts each worker in
  a session of its own), SIGKILL to whatever is left after a grace period.
- A parent killed outright (SIGKILL, or SIGTERM without a handler) runs none of that, so each worker also watches its
  owner (`watch_owner`, named in OOM_CASEBOOK_OWNER as pid:start-time) and exits within a second of its going;
  torchrun then exits with its failed workers.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import threading
import time

import psutil

from helpers.errors import MeasurementError

OWNER_ENV = "OOM_CASEBOOK_OWNER"
# A process group's rendezvous, as torch.distributed's env:// reads it (torch/distributed/rendezvous.py) and torchrun
# sets it. A parent that made a group of its own (helpers.measure.procgroup writes these into os.environ) would
# otherwise hand its live MASTER_PORT to the child, whose gloo store then fails with EADDRINUSE.
RENDEZVOUS_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
                  "MASTER_ADDR", "MASTER_PORT")
GRACE_S = 5.0
_live: set[subprocess.Popen] = set()


def _owner_id(pid: int) -> str:
    return f"{pid}:{psutil.Process(pid).create_time():.3f}"


def run(cmd: list[str], env: dict, timeout: float, what: str) -> subprocess.CompletedProcess:
    """Run `cmd` to completion (stdout and stderr captured as text); MeasurementError on a non-zero exit or after
    `timeout` seconds; the child and all its descendants are ended on any way out of this call. The child starts
    outside any process group of its parent's: the rendezvous variables and torchrun's own are not passed on."""
    env = {k: v for k, v in env.items() if k not in RENDEZVOUS_ENV and not k.startswith("TORCHELASTIC_")}
    env[OWNER_ENV] = _owner_id(os.getpid())
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    _live.add(proc)
    try:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise MeasurementError(f"{what} did not finish in {timeout:.0f} s and was stopped") from None
        result = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
        if proc.returncode != 0:
            tail = "\n".join((out + err).strip().splitlines()[-15:])
            raise MeasurementError(f"{what} failed (exit {proc.returncode}):\n{tail}")
        return result
    finally:
        terminate(proc)
        _live.discard(proc)


def terminate(proc: subprocess.Popen) -> None:
    """End `proc`, its process group and every descendant: SIGTERM, then SIGKILL after GRACE_S."""
    try:
        family = psutil.Process(proc.pid).children(recursive=True)    # before the parent goes: then they are orphans
    except psutil.Error:
        family = []
    if proc.poll() is None or family:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with _quiet():
                os.killpg(proc.pid, sig)
            for p in family:
                with _quiet():
                    p.send_signal(sig)
            _, family = psutil.wait_procs(family, timeout=GRACE_S if sig == signal.SIGTERM else 1.0)
            try:
                proc.wait(timeout=GRACE_S if sig == signal.SIGTERM else 1.0)
            except subprocess.TimeoutExpired:
                continue
            if not family:
                break
    with _quiet():
        proc.wait(timeout=1.0)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            with _quiet():
                stream.close()


class _quiet:
    """Ignore a process that is already gone (or a wait that ran out: the next signal follows)."""

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        return kind is not None and issubclass(kind, (ProcessLookupError, PermissionError, psutil.Error,
                                                      subprocess.TimeoutExpired))


@atexit.register
def _end_all() -> None:
    for proc in list(_live):
        terminate(proc)


def watch_owner(interval_s: float = 0.5) -> None:
    """In a child: exit (status 1) as soon as the process named in OOM_CASEBOOK_OWNER is gone. No-op without it."""
    owner = os.environ.get(OWNER_ENV)
    if not owner:
        return
    pid = int(owner.split(":")[0])

    def alive() -> bool:
        try:
            return _owner_id(pid) == owner
        except psutil.Error:
            return False

    def watch():
        while alive():
            time.sleep(interval_s)
        os._exit(1)

    threading.Thread(target=watch, name="owner-watchdog", daemon=True).start()
