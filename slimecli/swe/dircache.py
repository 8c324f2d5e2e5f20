"""Directories made once per key and then only copied from: the git directory of a task's base commit.

A workspace made from nothing costs a git init, a fetch (an upload-pack and a pack-objects on the source) and a
checkout. GRPO works and grades every task many times, each time in a fresh workspace; so the git directory of
one commit is made once per process and copied, and only the checkout is done per workspace. Entries are few
(past `max_entries` the least recently used one that nobody is copying is removed) and live in a private
temporary directory that this process removes when it exits.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class _Entry:
    path: Path
    ready: bool = False
    users: int = 0
    making: threading.Lock = field(default_factory=threading.Lock)


class DirCache:
    def __init__(self, max_entries: int = 8, prefix: str = "slimecli-cache-") -> None:
        self.max_entries = max_entries
        self.prefix = prefix
        self._root: Path | None = None
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._count = 0

    def _new_path(self) -> Path:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix=self.prefix))
            atexit.register(_remove, self._root, os.getpid())
        self._count += 1
        return self._root / str(self._count)

    @contextmanager
    def use(self, key: Hashable, make: Callable[[Path], None]) -> Iterator[Path]:
        """The directory of `key`, made by `make(an empty directory)` when missing (once, whoever asks first;
        after a failure the next caller tries again). Read it, never change it; it stays while in use."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry(self._new_path())
            self._entries.move_to_end(key)
            entry.users += 1
        try:
            with entry.making:
                if not entry.ready:
                    shutil.rmtree(entry.path, ignore_errors=True)
                    entry.path.mkdir()
                    make(entry.path)
                    entry.ready = True
            yield entry.path
        finally:
            self._release(entry)

    def _release(self, entry: _Entry) -> None:
        victims = []
        with self._lock:
            entry.users -= 1
            for key in list(self._entries):
                if len(self._entries) <= self.max_entries:
                    break
                if self._entries[key].users == 0:
                    victims.append(self._entries.pop(key).path)
        for path in victims:
            shutil.rmtree(path, ignore_errors=True)

    def __len__(self) -> int:
        return len(self._entries)


def _remove(root: Path, pid: int) -> None:
    if os.getpid() == pid:  # a forked child inherits the handler, not the directory
        shutil.rmtree(root, ignore_errors=True)
