import pytest

from lru import LRUCache, memoize


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_put_and_get():
    cache = LRUCache(3)
    cache.put("a", 1)
    assert cache.get("a") == 1
    assert cache.get("missing") is None
    assert cache.get("missing", 0) == 0


def test_evicts_least_recently_written():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("c", 3)
    assert cache.keys() == ["b", "c"]


def test_update_below_capacity_changes_value():
    cache = LRUCache(3)
    cache.put("a", 1)
    cache.put("a", 5)
    assert cache.get("a") == 5
    assert len(cache) == 1


def test_contains_and_len():
    cache = LRUCache(3)
    cache.put("a", 1)
    assert "a" in cache and "b" not in cache
    assert len(cache) == 1


def test_delete_and_clear():
    cache = LRUCache(3)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.delete("a") is True
    assert cache.delete("a") is False
    cache.clear()
    assert len(cache) == 0


def test_hit_and_miss_counts():
    cache = LRUCache(3)
    cache.put("a", 1)
    cache.get("a")
    cache.get("b")
    assert (cache.hits, cache.misses) == (1, 1)


def test_ttl_expiry():
    clock = FakeClock()
    cache = LRUCache(3, ttl=10, clock=clock)
    cache.put("a", 1)
    clock.now = 9
    assert cache.get("a") == 1
    clock.now = 11
    assert cache.get("a") is None
    assert "a" not in cache


def test_bad_arguments():
    with pytest.raises(ValueError):
        LRUCache(0)
    with pytest.raises(ValueError):
        LRUCache(2, ttl=0)


def test_memoize_calls_once_per_argument():
    calls = []

    @memoize(capacity=4)
    def square(x):
        calls.append(x)
        return x * x

    assert [square(3), square(3), square(4)] == [9, 9, 16]
    assert calls == [3, 4]
    assert square.cache.hits == 1
