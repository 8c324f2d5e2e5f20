"""`sandbox.max_processes` for a sandbox without a namespace of its own (local): a pids cgroup.

RLIMIT_NPROC cannot do it there. The kernel never applies it to root, and for any other user it counts every
process of that uid on the host (the trainer's threads included), not the sandbox's. A cgroup of the pids
controller counts exactly the processes and threads started inside it. Each sandbox gets one, made under
slimecli's own cgroup; its launcher joins it before the command starts, so everything the command forks is
counted, setsid'd strays included (which also lets close() find and kill them).

Making one needs write access to slimecli's cgroup: root with the pids controller mounted (cgroup v1), or a
cgroup v2 whose children have the pids controller enabled. Where that is missing, `unavailable()` says why,
and the run says that sandbox.max_processes does not apply.
"""

from __future__ import annotations

import functools
import os
import secrets
import signal
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
KILL_ROUNDS = 50  # a fork bomb is bounded by pids.max: a few rounds of SIGKILL empty the cgroup


def _own_cgroups() -> dict[str, str]:
    """Controller (or "" for the v2 hierarchy) -> this process's cgroup path, from /proc/self/cgroup."""
    out: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            out[name] = path
    return out


def parent() -> tuple[Path | None, str]:
    """The cgroup directory a sandbox's pids cgroup is made in, or (None, why there is none)."""
    own = _own_cgroups()
    if "pids" in own:  # cgroup v1 (or hybrid): the pids hierarchy is mounted on its own
        mount = CGROUP_ROOT / "pids"
        where = mount / own["pids"].lstrip("/")
        if not (mount / "cgroup.procs").is_file():
            return None, f"the pids cgroup controller is not mounted at {mount}"
    elif "" in own and (CGROUP_ROOT / "cgroup.controllers").is_file():  # cgroup v2
        where = CGROUP_ROOT / own[""].lstrip("/")
        try:
            enabled = (where / "cgroup.subtree_control").read_text().split()
        except OSError as exc:
            return None, f"cannot read {where}/cgroup.subtree_control ({exc.strerror})"
        if "pids" not in enabled:
            return None, f"the pids controller is not enabled for the children of {where} (cgroup v2)"
    else:
        return None, "no cgroup with the pids controller is mounted"
    if not os.access(where, os.W_OK):
        return None, (f"this user may not create cgroups under {where} (slimecli is not root, and the cgroup is not "
                      "delegated to it)")
    return where, ""


class PidsCgroup:
    """A cgroup of its own with pids.max set; `procs` is the file a process writes its pid to, to join it."""

    def __init__(self, limit: int) -> None:
        where, why = parent()
        if where is None:
            raise OSError(why)
        self.path = where / f"slimecli-sandbox-{os.getpid()}-{secrets.token_hex(4)}"
        self.path.mkdir()
        try:
            (self.path / "pids.max").write_text(str(limit))
        except OSError:
            self.path.rmdir()
            raise
        self.procs = self.path / "cgroup.procs"

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self.procs.read_text().split()]
        except (OSError, ValueError):
            return []

    def kill_all(self) -> None:
        """SIGKILL everything inside, until nothing is (no fork can outrun it for long: pids.max bounds it)."""
        for _ in range(KILL_ROUNDS):
            found = self.pids()
            if not found:
                return
            for pid in found:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
            time.sleep(0.02)

    def remove(self) -> None:
        """Kill what is inside and remove the cgroup (a dead process leaves it once it is reaped)."""
        self.kill_all()
        for _ in range(KILL_ROUNDS * 5):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:  # EBUSY: a killed process not yet reaped by its parent
                time.sleep(0.02)
                self.kill_all()


@functools.cache
def unavailable() -> str | None:
    """None when a pids cgroup can be made here (one is made and removed), else why not. Once per process."""
    try:
        PidsCgroup(1).remove()
    except OSError as exc:
        return str(exc) if not exc.strerror else f"cannot make a pids cgroup here ({exc.strerror})"
    return None
