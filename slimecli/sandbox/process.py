"""Killing process trees: one helper for every child slimecli starts (sandboxes, the embedded engine)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def kill_group(pgid: int, grace_s: float = 2.0, leader: subprocess.Popen | None = None) -> None:
    """SIGTERM the whole process group, then SIGKILL whatever is left (synchronous, bounded)."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if leader is not None:
                leader.poll()  # reap the leader, or its zombie keeps the group alive
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.05)


def gone(pid: int) -> bool:
    """Exited (a zombie counts: it runs nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """Pids still running after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [p for p in pids if not gone(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.02)


def children(pid: int) -> list[int]:
    """Direct children of `pid` (the namespace init under a bwrap process)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
        return [int(p) for p in text.split()]
    except FileNotFoundError:
        return []
    except OSError:  # kernels without CONFIG_PROC_CHILDREN: scan every process's parent
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(stat.parent.name))
            except (OSError, IndexError, ValueError):
                continue
        return found


def exit_status(returncode: int) -> int:
    """Popen's -N for 'killed by signal N' as a shell would report it (128 + N), like bwrap does."""
    return 128 - returncode if returncode < 0 else returncode
