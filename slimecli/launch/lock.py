"""A run directory's lock: one live command per run directory.

`RUN/.lock` holds the owner's host, pid and process start time, created with O_EXCL (atomic, also on
a shared file system). A lock whose owner is gone (same host, and that pid is dead or now another
process) is stale and taken over; a lock held from another host cannot be checked and is honoured
until its owner removes it.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slimecli.process import alive

LOCK_FILE = ".lock"


class RunInUse(RuntimeError):
    """Another live command holds the run directory."""

    def __init__(self, path: Path, owner: dict[str, Any]) -> None:
        self.path, self.owner = path, owner
        command = str(owner.get("command", ""))[:200]
        super().__init__(f"in use by pid {owner.get('pid')} on host {owner.get('host')} since "
                         f"{owner.get('started', '?')} ({command}); stop that command, wait for it, or pick another "
                         f"run.dir" + ("" if owner.get("host") == socket.gethostname() else
                                       f" (a lock from another host: remove {path} once that run is over)"))


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot: tells a live owner from a reused pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _age_s(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


def _is_stale(owner: dict[str, Any]) -> bool:
    if owner.get("host") != socket.gethostname():
        return False
    pid = owner.get("pid")
    if not isinstance(pid, int) or not alive(pid):
        return True
    started = owner.get("start_time")
    return started is not None and _start_time(pid) not in (None, started)


@dataclass
class RunLock:
    path: Path

    def release(self) -> None:
        """Remove the lock if it is still ours (a forked child or a takeover leaves it alone)."""
        try:
            owner = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        if owner.get("pid") == os.getpid() and owner.get("host") == socket.gethostname():
            self.path.unlink(missing_ok=True)


def acquire(run_dir: Path, command: str) -> RunLock:
    """Lock `run_dir` for this process until it exits; RunInUse when a live command holds it."""
    path = run_dir / LOCK_FILE
    me = {"host": socket.gethostname(), "pid": os.getpid(), "start_time": _start_time(os.getpid()),
          "started": time.strftime("%Y-%m-%d %H:%M:%S"), "command": command}
    for _ in range(3):  # a stale lock is removed once; a racing taker may win the retry
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                owner = json.loads(path.read_text())
            except (OSError, ValueError):
                owner = {}  # half-written: being taken right now, or by a command that died at once
                if _age_s(path) < 5.0:
                    owner = {"pid": "?", "host": socket.gethostname(), "command": "a command taking the lock now"}
                    raise RunInUse(path, owner) from None
            if owner and not _is_stale(owner):
                raise RunInUse(path, owner) from None
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        lock = RunLock(path)
        atexit.register(lock.release)
        return lock
    raise RunInUse(path, {"pid": "?", "host": "?", "command": "another command taking the lock at the same time"})
