"""A least-recently-used cache with an optional time-to-live, and a memoizing decorator built on it.

>>> cache = LRUCache(2)
>>> cache.put("a", 1); cache.put("b", 2); cache.put("c", 3)
>>> cache.keys()
['b', 'c']
"""

from __future__ import annotations

import functools
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["LRUCache", "memoize"]

_MISSING = object()


class LRUCache:
    """At most `capacity` entries; reading or writing a key makes it the most recently used, and a write to a
    full cache evicts the least recently used key. With `ttl` (seconds), an entry written at time t is gone
    from time t + ttl on. `clock` is injectable so that tests need not sleep."""

    def __init__(self, capacity: int, ttl: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        if ttl is not None and ttl <= 0:
            raise ValueError(f"ttl must be positive, got {ttl}")
        self.capacity = capacity
        self.ttl = ttl
        self.clock = clock
        self.hits = 0
        self.misses = 0
        self._data: OrderedDict[Hashable, tuple[Any, float]] = OrderedDict()  # key -> (value, expiry time)

    def _expired(self, expires_at: float) -> bool:
        return self.ttl is not None and self.clock() >= expires_at

    def _purge(self) -> None:
        for key in [k for k, (_, expires_at) in self._data.items() if self._expired(expires_at)]:
            del self._data[key]

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value, or `default` for a missing or expired key; counts a hit or a miss."""
        entry = self._data.get(key)
        if entry is None or self._expired(entry[1]):
            if entry is not None:
                del self._data[key]
            self.misses += 1
            return default
        self._data.move_to_end(key)
        self.hits += 1
        return entry[0]

    def put(self, key: Hashable, value: Any) -> None:
        self._purge()
        expires_at = self.clock() + self.ttl if self.ttl is not None else float("inf")
        if key in self._data:
            self._data.move_to_end(key)
        elif len(self._data) >= self.capacity:
            self._data.popitem(last=False)
        self._data[key] = (value, expires_at)

    def delete(self, key: Hashable) -> bool:
        """Remove the key; False when it was not there."""
        return self._data.pop(key, _MISSING) is not _MISSING

    def clear(self) -> None:
        self._data.clear()

    def keys(self) -> list[Hashable]:
        """The live keys, least recently used first (does not change the order)."""
        self._purge()
        return list(self._data)

    def __contains__(self, key: Hashable) -> bool:
        """Membership without touching the order or the hit/miss counts."""
        entry = self._data.get(key)
        return entry is not None and not self._expired(entry[1])

    def __len__(self) -> int:
        self._purge()
        return len(self._data)

    def resize(self, capacity: int) -> None:
        """Change the capacity; shrinking evicts the least recently used keys until the rest fit."""
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        while len(self._data) > capacity:
            self._data.popitem(last=False)


def memoize(capacity: int = 128, ttl: float | None = None,
            clock: Callable[[], float] = time.monotonic) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Cache a function's results by its (hashable) arguments; the cache is the wrapper's `cache` attribute."""

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        cache = LRUCache(capacity, ttl, clock)

        @functools.wraps(fn)
        def wrapper(*args: Hashable, **kwargs: Hashable) -> Any:
            key = (args, tuple(sorted(kwargs.items())))
            value = cache.get(key, _MISSING)
            if value is _MISSING:
                value = fn(*args, **kwargs)
                cache.put(key, value)
            return value

        wrapper.cache = cache  # type: ignore[attr-defined]
        return wrapper

    return decorator
