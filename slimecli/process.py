"""Process groups and process trees: one helper for every child slimecli starts (the supervisor's
servers and workers, sandboxes, the embedded engine of `agent serve`).

Every child runs in its own session, so its process group holds it and whatever it started;
stopping a child means stopping that group: SIGTERM, a grace period, then SIGKILL.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, TypeAlias


class Reapable(Protocol):
    """A child this process waits for: a Popen, or a child forked from the run's template (launch/forked.py)."""

    def poll(self) -> int | None: ...


class Started(Reapable, Protocol):
    """A started child as its owner sees it: a Popen, or a forked child (launch/forked.py: ForkedProcess)."""

    pid: int
    returncode: int | None

    def wait(self, timeout: float | None = None) -> int: ...


Leader: TypeAlias = "Reapable | None"  # a group's leader, reaped while we wait

POLL_S = 0.05
# the attempt a run's processes belong to: 0, then 1, 2, .. after each of run.max_restarts restarts
RESTART_ENV = "SLIMECLI_RESTART"
# a server the supervisor restarted (launch/restarts.py): which restart it is; and, for an engine of a training run,
# that it must not generate until the trainer has given it the current weights
SERVER_RESTART_ENV = "SLIMECLI_SERVER_RESTART"
AWAIT_WEIGHTS_ENV = "SLIMECLI_AWAIT_WEIGHTS"


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to process group `pgid`; False when the group is gone (or is not ours)."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def terminate_groups(groups: Mapping[int, Leader], grace_s: float, kill_wait_s: float = 2.0) -> list[int]:
    """SIGTERM every group at once, wait up to `grace_s` for all of them to empty, SIGKILL the rest.

    `groups` maps a process group id to its leader's Popen (polled so that its zombie, which
    would keep the group alive, is reaped) or None. Synchronous and bounded: returns after at
    most `grace_s + kill_wait_s`, with the groups that outlived SIGTERM (they got SIGKILL).
    SIGCONT follows the SIGTERM (as systemd sends it): a stopped process (SIGSTOP, a debugger
    let go) handles its SIGTERM at once instead of waiting out the grace for SIGKILL.
    """
    termed = {g: leader for g, leader in groups.items() if signal_group(g, signal.SIGTERM)}
    for g in termed:
        signal_group(g, signal.SIGCONT)
    live = _wait_empty(termed, grace_s)
    _wait_empty({g: groups[g] for g in live if signal_group(g, signal.SIGKILL)}, kill_wait_s)
    return live


def kill_group(pgid: int, grace_s: float = 2.0, leader: Leader = None) -> None:
    """SIGTERM the whole process group, then SIGKILL whatever is left (synchronous, bounded)."""
    terminate_groups({pgid: leader}, grace_s)


def _wait_empty(groups: Mapping[int, Leader], timeout_s: float) -> list[int]:
    """Groups that still have a process after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        for leader in groups.values():
            if leader is not None:
                leader.poll()  # reap the leader, or its zombie keeps the group alive
        live = [g for g in groups if signal_group(g, 0)]
        if not live or time.monotonic() >= deadline:
            return live
        time.sleep(POLL_S)


def command_line(pid: int) -> list[str]:
    """A process's arguments ([] once it is gone). A process forked from the run's template shows its command as
    one string (setproctitle, launch/template.py): split at its spaces."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    parts = [p.decode(errors="replace") for p in raw.split(b"\0") if p]
    return parts[0].split(" ") if len(parts) == 1 else parts


def alive(pid: int) -> bool:
    """A process with this pid exists (another user's counts: signal 0 is refused, not unknown)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def state(pid: int) -> str | None:
    """The process's state letter in /proc (R, S, D, T: stopped, Z: zombie, ...); None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def gone(pid: int) -> bool:
    """Exited (a zombie counts: it runs nothing)."""
    return state(pid) in (None, "Z", "X")


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


def descendants(roots: list[int]) -> list[int]:
    """The roots and every process below them (the children of every thread, as torchrun's ranks are)."""
    out, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            tasks = []
        for task in tasks:
            try:
                todo += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
            except OSError:
                continue
    return out


def exit_status(returncode: int) -> int:
    """Popen's -N for 'killed by signal N' as a shell would report it (128 + N), like bwrap does."""
    return 128 - returncode if returncode < 0 else returncode
