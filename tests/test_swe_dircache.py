"""The git directories workspaces are copied from: made once per key, kept while in use, retried after a failure."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from slimecli.swe.dircache import DirCache


def test_made_once_per_key_across_threads_and_the_oldest_unused_goes():
    cache = DirCache(max_entries=2)
    made: list[str] = []

    def make(key: str):  # type: ignore[no-untyped-def]
        def fill(path: Path) -> None:
            made.append(key)
            (path / "content").write_text(key)
        return fill

    seen: list[str] = []

    def worker() -> None:
        with cache.use("a", make("a")) as path:
            seen.append((path / "content").read_text())

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert made == ["a"] and seen == ["a"] * 6

    with cache.use("b", make("b")) as b_path:
        with cache.use("c", make("c")):  # three entries, "a" the least recently used and unused: removed
            pass
        assert b_path.is_dir()  # in use: never removed under a reader
    assert len(cache) == 2
    with cache.use("a", make("a")):
        pass
    assert made == ["a", "b", "c", "a"]


def test_a_failed_make_is_retried_by_the_next_caller():
    cache = DirCache()
    calls = []

    def flaky(path: Path) -> None:
        calls.append(path)
        (path / "half").write_text("")
        if len(calls) == 1:
            raise OSError("disk full")

    with pytest.raises(OSError):
        with cache.use("k", flaky):
            pass
    with cache.use("k", flaky) as path:
        assert sorted(p.name for p in path.iterdir()) == ["half"]  # started again from an empty directory
    assert len(calls) == 2
