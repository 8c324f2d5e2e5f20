"""The environment cache: one directory per key, built in place at most once at a time, ready once its manifest is.

A venv cannot move after it is made (its scripts name their own path), so a build happens in the final
directory under an exclusive file lock on the key; the manifest is written last, by rename, and a lookup
that finds it takes no lock at all. A directory without a manifest is a build that died: the next builder
removes it. Every build writes its log to logs/<key>.log; a failed one leaves logs/<key>.failed, which
pre-flight reports until a build succeeds or the cache is pruned.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST = "slimecli-env.json"
MIN_FREE_MB = 512  # below this under the cache, a build is refused before it starts


class BuildFailed(Exception):
    """A build did not produce a working environment: `reason` is one short word, `log` its build log."""

    def __init__(self, reason: str, detail: str, log: Path | None = None) -> None:
        super().__init__(f"{reason}: {detail}" + (f" (log: {log})" if log else ""))
        self.reason = reason
        self.detail = detail
        self.log = log


@dataclass(frozen=True)
class Entry:
    key: str
    path: Path
    manifest: dict[str, Any]
    size_bytes: int


def default_root() -> Path:
    """$SLIMECLI_CACHE/envs, else ~/.cache/slimecli/envs (next to the built-in repositories and the tiny model)."""
    from slimecli.swe.builtin import cache_root

    return cache_root() / "envs"


def root_of(configured: str | None) -> Path:
    return Path(configured).expanduser() if configured else default_root()


class Store:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.failed: dict[str, BuildFailed] = {}  # this process's failed builds: not retried for every task

    def path(self, key: str) -> Path:
        return self.root / key

    def log(self, key: str) -> Path:
        return self.root / "logs" / f"{key}.log"

    def _failure_file(self, key: str) -> Path:
        return self.root / "logs" / f"{key}.failed"

    def ready(self, key: str) -> dict[str, Any] | None:
        """The manifest of a finished build, else None. No lock: the manifest appears by rename, last."""
        try:
            return json.loads((self.path(key) / MANIFEST).read_text())
        except (OSError, ValueError):
            return None

    def last_failure(self, key: str) -> str | None:
        """Why the last build of `key` failed (any process), while no build has succeeded since."""
        try:
            return self._failure_file(key).read_text().strip() or "failed"
        except OSError:
            return None

    @contextmanager
    def locked(self, key: str) -> Iterator[None]:
        locks = self.root / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        with open(locks / f"{key}.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def build_problem(self) -> str | None:
        """Why no build can start under the cache root (not creatable, not writable, nearly full), else None."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return f"cannot create the environment cache {self.root}: {exc.strerror or exc}"
        if not os.access(self.root, os.W_OK | os.X_OK):
            return f"the environment cache {self.root} is not writable"
        free_mb = shutil.disk_usage(self.root).free >> 20
        if free_mb < MIN_FREE_MB:
            return f"the disk under the environment cache {self.root} is full ({free_mb} MiB free, needs {MIN_FREE_MB})"
        return None

    def ensure(self, key: str, build: Callable[[Path, Path], dict[str, Any]], *, retry: bool = False) -> dict[str, Any]:
        """The manifest of `key`, building it with `build(directory, log)` when missing. BuildFailed when the
        build fails; a key that failed in this process fails again at once unless `retry`."""
        found = self.ready(key)
        if found is not None:
            return found
        if key in self.failed and not retry:
            raise self.failed[key]
        problem = self.build_problem()
        if problem is not None:
            raise BuildFailed("disk", problem)
        with self.locked(key):
            found = self.ready(key)  # another builder finished while this one waited
            if found is not None:
                return found
            try:
                manifest = self._build(key, build)
            except BuildFailed as exc:
                self.failed[key] = exc
                try:
                    self._failure_file(key).write_text(str(exc) + "\n")
                except OSError:
                    pass
                raise
            self.failed.pop(key, None)
            self._failure_file(key).unlink(missing_ok=True)
            return manifest

    def _build(self, key: str, build: Callable[[Path, Path], dict[str, Any]]) -> dict[str, Any]:
        target, log = self.path(key), self.log(key)
        shutil.rmtree(target, ignore_errors=True)  # what a build that died left
        try:
            log.parent.mkdir(parents=True, exist_ok=True)
            target.mkdir(parents=True)
            started = time.time()
            manifest = {"key": key, **build(target, log), "built_at": started,
                        "build_s": round(time.time() - started, 3), "log": str(log)}
            tmp = target / f".{MANIFEST}.tmp"
            tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
            tmp.rename(target / MANIFEST)
            return manifest
        except BuildFailed:
            shutil.rmtree(target, ignore_errors=True)
            raise
        except OSError as exc:
            shutil.rmtree(target, ignore_errors=True)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise BuildFailed("disk", f"no space left under {self.root}", log) from None
            raise BuildFailed("build", f"{exc.strerror or exc}", log) from None
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise

    def entries(self) -> list[Entry]:
        """Every finished environment, with its size on disk."""
        out: list[Entry] = []
        if not self.root.is_dir():
            return out
        for path in sorted(self.root.iterdir()):
            manifest = self.ready(path.name) if path.is_dir() and not path.name.startswith(".") else None
            if manifest is not None and path.name != "logs":
                out.append(Entry(path.name, path, manifest, _size(path)))
        return out

    def prune(self, keys: list[str] | None = None) -> list[str]:
        """Remove the environments named (None: all of them), unfinished builds and failure records; each under
        its lock, so a build in progress is waited for, never cut off. The keys removed."""
        removed: list[str] = []
        if not self.root.is_dir():
            return removed
        present = [p.name for p in self.root.iterdir() if p.is_dir() and p.name not in ("logs", ".locks")]
        for key in sorted(present if keys is None else keys):
            with self.locked(key):
                shutil.rmtree(self.path(key), ignore_errors=True)
                self.log(key).unlink(missing_ok=True)
                self._failure_file(key).unlink(missing_ok=True)
            removed.append(key)
        if keys is None:
            shutil.rmtree(self.root / "logs", ignore_errors=True)
        return removed


def _size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total
