"""The disk quota of a sandbox: how much its workspace and home may grow while its commands run.

No filesystem quota is available to an unprivileged process, so a watchdog thread measures. A full walk
of a large repository is too slow to run every few milliseconds, so a cheap statvfs of the filesystems
involved runs often and triggers a walk as soon as they fill by a noticeable fraction of what is left
(plus a walk every `walk_every_s` regardless). Per-file size is bounded separately (RLIMIT_FSIZE).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

POLL_S = 0.02
WALK_EVERY_S = 2.0


def usage(*roots: Path) -> int:
    """Bytes allocated under the roots: links not followed, hard links counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [str(r) for r in roots]
    while stack:
        top = stack.pop()
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
    return total


def _fs_used(roots: Sequence[Path]) -> int:
    used, devs = 0, set()
    for root in roots:
        try:
            dev = os.stat(root).st_dev
            if dev in devs:
                continue
            devs.add(dev)
            st = os.statvfs(root)
        except OSError:
            continue
        used += (st.f_blocks - st.f_bfree) * st.f_frsize
    return used


class DiskQuota:
    """Calls `on_exceeded` once the roots hold more than `limit_bytes` beyond what they held at the start."""

    def __init__(self, roots: Sequence[Path], limit_bytes: int, on_exceeded: Callable[[], None]) -> None:
        self.roots = list(roots)
        self.limit = limit_bytes
        self.on_exceeded = on_exceeded
        self.baseline = usage(*self.roots)
        self.exceeded = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def grown(self) -> int:
        return usage(*self.roots) - self.baseline

    def check(self) -> bool:
        """Walk now; True (and on_exceeded called) when over the quota."""
        if not self.exceeded and self.grown() > self.limit:
            self.exceeded = True
            self.on_exceeded()
        return self.exceeded

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, daemon=True, name="sandbox-disk-quota")
            self._thread.start()

    def _watch(self) -> None:
        last_walk, fs_at_walk = time.monotonic(), _fs_used(self.roots)
        left = self.limit
        while not self._stop.wait(POLL_S) and not self.exceeded:
            fs_now = _fs_used(self.roots)
            if fs_now - fs_at_walk > left // 4 or time.monotonic() - last_walk > WALK_EVERY_S:
                grown = self.grown()
                if grown > self.limit:
                    self.exceeded = True
                    self.on_exceeded()
                    return
                last_walk, fs_at_walk, left = time.monotonic(), fs_now, self.limit - grown

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
