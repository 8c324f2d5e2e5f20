"""A batch KV cache that rows join and leave between decode steps (continuous batching on HF models).

Rows are left-padded to a shared length; each layer keeps keys/values in a preallocated buffer that grows
by doubling, so a decode step writes one column in place instead of re-concatenating the whole cache the
way HF's DynamicCache does. The model sees an ordinary `transformers` Cache.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

GROW_MIN = 64


class SlotLayer(DynamicLayer):  # type: ignore[no-untyped-call]  # transformers' cache layers are unannotated
    """One layer's keys/values [rows, heads, capacity, dim]; the first `length` columns are valid."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # unannotated in transformers
        self.length = 0
        self.kbuf: torch.Tensor | None = None
        self.vbuf: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.dtype = key_states.device, key_states.dtype
        self.is_initialized = True

    def _reserve(self, need: int, like: torch.Tensor, like_v: torch.Tensor) -> None:
        cap = 0 if self.kbuf is None else self.kbuf.shape[2]
        if need <= cap:
            return
        new_cap = max(need, 2 * cap, GROW_MIN)
        b, h, _, d = like.shape
        kbuf = like.new_zeros((b, h, new_cap, d))
        vbuf = like_v.new_zeros((b, like_v.shape[1], new_cap, like_v.shape[3]))
        if self.kbuf is not None and self.length:
            assert self.vbuf is not None  # allocated together with kbuf
            kbuf[:, :, :self.length] = self.kbuf[:, :, :self.length]
            vbuf[:, :, :self.length] = self.vbuf[:, :, :self.length]
        self.kbuf, self.vbuf = kbuf, vbuf

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        self._reserve(end, key_states, value_states)
        assert self.kbuf is not None and self.vbuf is not None
        self.kbuf[:, :, self.length:end] = key_states
        self.vbuf[:, :, self.length:end] = value_states
        self.length = end
        self.keys, self.values = self.kbuf[:, :, :end], self.vbuf[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query: int | torch.Tensor, *args: Any) -> tuple[int, int]:
        # transformers 5 passes the query length; 4.5x passes cache_position (one entry per query token)
        q = int(query.shape[0]) if isinstance(query, torch.Tensor) else int(query)
        return self.length + q, 0

    def reset(self) -> None:
        self.length, self.kbuf, self.vbuf = 0, None, None
        self.keys = self.values = None
        self.is_initialized = False

    def set(self, keys: torch.Tensor, values: torch.Tensor, spare: int = 0) -> None:
        """Replace the content with exactly these (valid) columns, leaving `spare` free columns."""
        b, h, n, d = keys.shape
        self.kbuf = keys.new_zeros((b, h, n + spare, d))
        self.vbuf = values.new_zeros((b, values.shape[1], n + spare, values.shape[3]))
        self.kbuf[:, :, :n] = keys
        self.vbuf[:, :, :n] = values
        self.length = n
        self.keys, self.values = self.kbuf[:, :, :n], self.vbuf[:, :, :n]
        self.device, self.dtype, self.is_initialized = keys.device, keys.dtype, True

    def valid(self) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.kbuf is not None and self.vbuf is not None
        return self.kbuf[:, :, :self.length], self.vbuf[:, :, :self.length]


class BatchCache(DynamicCache):
    """A DynamicCache whose layers are SlotLayers, plus the row operations continuous batching needs."""

    def __init__(self, num_layers: int) -> None:
        super().__init__()
        self.layers = [SlotLayer() for _ in range(num_layers)]

    @property
    def length(self) -> int:
        return self.slot_layers[0].length if self.layers else 0

    @property
    def slot_layers(self) -> list[SlotLayer]:
        return self.layers  # type: ignore[return-value]

    def select_rows(self, rows: torch.Tensor, trim_left: int = 0) -> None:
        """Keep only `rows` (an index tensor) and drop `trim_left` leading columns that are padding for all."""
        for layer in self.slot_layers:
            k, v = layer.valid()
            layer.set(k.index_select(0, rows)[:, :, trim_left:], v.index_select(0, rows)[:, :, trim_left:],
                      spare=GROW_MIN)

    def repeat_rows(self, rows: torch.Tensor) -> None:
        """Rows in a new order, with repeats (copies of a prefilled prompt)."""
        self.select_rows(rows)

    def merge(self, other: BatchCache) -> tuple[int, int]:
        """Append other's rows; the shorter side is left-padded. Returns the pads added to (self, other)."""
        n_self, n_other = self.length, other.length
        total = max(n_self, n_other)
        for mine, theirs in zip(self.slot_layers, other.slot_layers, strict=True):
            k1, v1 = mine.valid()
            k2, v2 = theirs.valid()
            b1, b2 = k1.shape[0], k2.shape[0]
            keys = k1.new_zeros((b1 + b2, k1.shape[1], total + GROW_MIN, k1.shape[3]))
            values = v1.new_zeros((b1 + b2, v1.shape[1], total + GROW_MIN, v1.shape[3]))
            keys[:b1, :, total - n_self:total] = k1
            values[:b1, :, total - n_self:total] = v1
            keys[b1:, :, total - n_other:total] = k2
            values[b1:, :, total - n_other:total] = v2
            mine.kbuf, mine.vbuf, mine.length = keys, values, total
            mine.keys, mine.values = keys[:, :, :total], values[:, :, :total]
        return total - n_self, total - n_other
