"""Keys/values of finished sequences, reused when a new prompt starts with the same tokens.

An agent's next turn re-sends its whole conversation (tens of thousands of tokens for a coding CLI); with
this cache only the new tail is prefilled. Matching is by longest common prefix, so sessions that share a
system prompt also share its prefill. Bounded in bytes, least recently used first out; cleared on a weight
update or /flush_cache (stale keys/values must never serve new weights).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import torch


@dataclass
class Entry:
    tokens: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, heads, len(tokens), dim]
    nbytes: int


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixCache:
    def __init__(self, max_bytes: int, min_tokens: int = 256) -> None:
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens
        self.entries: collections.OrderedDict[int, Entry] = collections.OrderedDict()
        self.nbytes = 0
        self._next = 0
        self.hits = 0
        self.hit_tokens = 0

    def clear(self) -> None:
        self.entries.clear()
        self.nbytes = 0

    def put(self, tokens: list[int], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        if len(tokens) < self.min_tokens or self.max_bytes <= 0:
            return
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if nbytes > self.max_bytes:
            return
        for key, e in list(self.entries.items()):  # a longer sequence that contains an entry supersedes it
            if len(e.tokens) <= len(tokens) and tokens[:len(e.tokens)] == e.tokens:
                self._drop(key)
        while self.entries and self.nbytes + nbytes > self.max_bytes:
            self._drop(next(iter(self.entries)))
        self.entries[self._next] = Entry(list(tokens), layers, nbytes)
        self._next += 1
        self.nbytes += nbytes

    def _drop(self, key: int) -> None:
        self.nbytes -= self.entries.pop(key).nbytes

    def match(self, context: list[int]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """The longest reusable prefix of `context` (always leaving one token to run): (length, kv) or (0, None)."""
        best, best_key = 0, None
        m = self.min_tokens
        if len(context) <= m:
            return 0, None
        head = context[:m]
        for key, e in self.entries.items():
            if e.tokens[:m] != head:  # cheap reject before the full comparison
                continue
            n = min(common_prefix(e.tokens, context), len(context) - 1)
            if n > best:
                best, best_key = n, key
        if best_key is None or best < self.min_tokens:
            return 0, None
        self.entries.move_to_end(best_key)
        self.hits += 1
        self.hit_tokens += best
        e = self.entries[best_key]
        return best, [(k[:, :, :best], v[:, :, :best]) for k, v in e.layers]
