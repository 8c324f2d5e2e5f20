"""Processes a sandbox command left behind outside its process group, and removing a sandbox's root.

A command may detach a child into a new session (`setsid cmd &`, a daemonising tool): killing the
command's process group misses it, and it can keep the command's stdout open (so reading the output
never ends) or keep writing into the workspace (so the root comes back after it was removed). Where
the kind has no pid namespace (local), such strays are found through /proc: a process holding one of
the command's pipes, or whose working directory, open files or HOME lie in the sandbox's root.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import sys
from collections.abc import Callable, Collection
from pathlib import Path


def _links(pid: str) -> list[str]:
    out = []
    try:
        out.append(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        pass
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return out


def holders(pipe_inodes: Collection[int] = (), root: Path | None = None) -> list[int]:
    """Pids (not this process) holding one of ``pipe_inodes``, or living in ``root`` (cwd, an open file, HOME)."""
    pipes = {f"pipe:[{ino}]" for ino in pipe_inodes}
    prefix = f"{root}/" if root is not None else None
    home = f"HOME={root}/".encode() if root is not None else None
    me = os.getpid()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for pid in entries:
        if not pid.isdigit() or int(pid) == me:
            continue
        links = _links(pid)
        hit = any(link in pipes for link in links)
        if not hit and prefix is not None:
            hit = any(link == str(root) or link.startswith(prefix) for link in links)
            if not hit and home is not None:
                try:
                    hit = home in Path(f"/proc/{pid}/environ").read_bytes()
                except OSError:
                    pass
        if hit:
            found.append(int(pid))
    return found


def kill_holders(pipe_inodes: Collection[int] = (), root: Path | None = None, rounds: int = 5) -> int:
    """SIGKILL every holder until none is left (a stray may fork while it is looked for); how many died."""
    killed = 0
    for _ in range(rounds):
        pids = holders(pipe_inodes, root)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                continue
    return killed


def _writable_retry(func: Callable[[str], object], path: str, _exc: object) -> None:
    """rmtree's error hook: a directory made read-only inside (chmod -R a-w, Go's module cache) is made
    writable by its owner again, then the removal is retried."""
    parent = os.path.dirname(path)
    for p in (parent, path):
        try:
            st = os.lstat(p)
            if stat.S_ISDIR(st.st_mode):
                os.chmod(p, st.st_mode | stat.S_IRWXU)
        except OSError:
            pass
    try:
        func(path)
    except FileNotFoundError:
        pass
    except OSError:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)


def remove_root(root: Path, attempts: int = 3, strays: bool = True) -> bool:
    """Remove ``root`` entirely: strays living in it are killed first (they could re-create files), read-only
    directories are made writable; True when it is gone. ``strays=False`` where none can exist (a pid namespace
    whose init is dead): the look through /proc costs tens of milliseconds on a busy machine."""
    for _ in range(attempts):
        if strays:
            kill_holders(root=root)
        if not root.exists():
            return True
        if sys.version_info >= (3, 12):
            shutil.rmtree(root, onexc=_writable_retry)
        else:
            shutil.rmtree(root, onerror=_writable_retry)
        if not root.exists():
            return True
    return not root.exists()
