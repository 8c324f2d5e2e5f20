"""The running batch on the model: prefill new sequences, merge them into the batch cache, decode one step.

Invariant: for every running row the cache holds all of its context except the last sampled token, which
is the input of the next decode step. Rows are left-padded; position ids count real tokens only.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from slimecli.engine.decoder import Decoder
from slimecli.engine.kvcache import GROW_MIN, BatchCache
from slimecli.engine.prefix_cache import PrefixCache
from slimecli.engine.seq import Seq

# Prefill groups split where padding the members so far up to a longer sequence would cost more than this many
# tokens: a forward's fixed cost is about that many tokens' worth of a small model's prefill on a CPU core
PREFILL_SPLIT_PAD = 64


def _cache_kwarg(model: Any) -> str:
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class Runner:
    def __init__(self, model: Any, pad_id: int = 0, max_prefill_tokens: int = 8192,
                 prefix_cache: PrefixCache | None = None) -> None:
        self.pad_id = pad_id
        self.prefix = prefix_cache
        self.max_prefill_tokens = max_prefill_tokens
        self.rows: list[Seq] = []
        self.pads: list[int] = []
        self.cache: BatchCache | None = None
        self.weights = 0  # bumped by every set_model: keys/values of an older generation are stale
        self.set_model(model)

    def set_model(self, model: Any) -> None:
        self.model = model
        self.num_layers = model.config.get_text_config().num_hidden_layers
        self.device = next(model.parameters()).device
        self.cache_kw = _cache_kwarg(model)
        self.decoder = Decoder.of(model)  # None: decode steps run the model's full forward
        self._new_weights()

    def load_weights(self, copy: Callable[[Any], None]) -> None:
        """Overwrite the served model's tensors in place (``copy(model)``), between two steps."""
        copy(self.model)
        self._new_weights()

    def _new_weights(self) -> None:
        self.weights += 1
        if self.prefix is not None:
            self.prefix.clear()  # keys/values of the old weights must not serve the new ones

    # ---- forward --------------------------------------------------------------------------
    def _forward(self, ids: torch.Tensor, mask: torch.Tensor | None, pos: torch.Tensor, cache: BatchCache,
                 keep: int = 1) -> torch.Tensor:
        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                             logits_to_keep=keep, **{self.cache_kw: cache})
        logits: torch.Tensor = out.logits  # a transformers output: untyped
        return logits

    def groups(self, seqs: list[Seq]) -> list[list[Seq]]:
        """Split new sequences, shortest first, into prefill groups whose padded size stays under
        max_prefill_tokens, and where a longer sequence would pad the group's others by PREFILL_SPLIT_PAD
        tokens or more in all, into a group of its own."""
        groups: list[list[Seq]] = []
        cur: list[Seq] = []
        longest = 0
        for s in sorted(seqs, key=lambda s: len(s.context())):
            n = len(s.context())
            if self._needs_all_logits(s):
                groups.append([s])  # needs logits at every prompt position: alone
                continue
            # a longer sequence pads every member so far up to it: past PREFILL_SPLIT_PAD tokens of padding, a
            # forward of its own costs less
            if cur and (max(longest, n) * (len(cur) + 1) > self.max_prefill_tokens
                        or (n - longest) * len(cur) > PREFILL_SPLIT_PAD):
                groups.append(cur)
                cur, longest = [], 0
            cur.append(s)
            longest = max(longest, n)
        if cur:
            groups.append(cur)
        return groups

    @staticmethod
    def _needs_all_logits(s: Seq) -> bool:
        """Input log-probs asked for and not yet computed (a retracted sequence keeps its own)."""
        return s.item.return_logprob and s.item.logprob_start_len >= 0 and s.input_logprobs is None

    def prefill(self, group: list[Seq]) -> torch.Tensor:
        """Run the group's contexts, join them to the batch; return next-token logits [len(group), vocab]."""
        out: dict[int, torch.Tensor] = {}
        misses = []
        for s in group:
            hit, kv = (0, None)
            if self.prefix is not None and not self._needs_all_logits(s):
                hit, kv = self.prefix.match(s.context())
            if kv is None:
                misses.append(s)
            else:
                s.cached_tokens = hit
                out[s.uid] = self._prefill_cached(s, hit, kv)
        if misses:
            for s, row in zip(misses, self._prefill_batch(misses), strict=True):
                out[s.uid] = row
        # Offered to the cache now, not when they finish: sessions that start together (every agent run of a
        # step) then share the CLI's system prompt from the second prefill on.
        self.save(list(range(len(self.rows) - len(group), len(self.rows))))  # the group's rows were joined last
        return torch.stack([out[s.uid] for s in group])

    def _prefill_cached(self, seq: Seq, hit: int, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Only the tail after a cached prefix runs; it attends to the cached keys/values."""
        ctx = seq.context()
        cache = BatchCache(self.num_layers)
        for layer, (k, v) in zip(cache.slot_layers, kv, strict=True):
            layer.set(k, v, spare=len(ctx) - hit + GROW_MIN)
        ids = torch.tensor([ctx[hit:]], dtype=torch.long, device=self.device)
        pos = torch.arange(hit, len(ctx), device=self.device).unsqueeze(0)
        logits = self._forward(ids, None, pos, cache)[:, -1, :]
        self._join(cache, [seq], [0])
        return logits[0]

    def _prefill_batch(self, group: list[Seq]) -> torch.Tensor:
        contexts = [s.context() for s in group]
        unique: dict[tuple[int, ...], int] = {}
        which = [unique.setdefault(tuple(c), len(unique)) for c in contexts]
        prompts = list(unique)
        longest = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), longest), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, longest - len(p):] = torch.tensor(p)
            mask[i, longest - len(p):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        padded = bool((mask == 0).any())
        cache = BatchCache(self.num_layers)
        full = len(group) == 1 and self._needs_all_logits(group[0])
        dev = self.device
        logits = self._forward(ids.to(dev), mask.to(dev) if padded else None, pos.to(dev), cache,
                               keep=0 if full else 1)
        if full:
            self._input_logprobs(group[0], logits[0])
        last = logits[:, -1, :]
        if len(prompts) != len(group) or which != list(range(len(group))):
            index = torch.tensor(which, device=self.device)
            cache.repeat_rows(index)
            last = last.index_select(0, index)
        self._join(cache, group, [longest - len(c) for c in contexts])
        return last

    def _join(self, cache: BatchCache, seqs: list[Seq], own_pads: list[int]) -> None:
        for s in seqs:
            s.kv_weights = self.weights
        if self.cache is None or not self.rows:
            self.cache, self.rows, self.pads = cache, list(seqs), own_pads
        else:
            add_self, add_new = self.cache.merge(cache)
            self.pads = [p + add_self for p in self.pads] + [p + add_new for p in own_pads]
            self.rows.extend(seqs)

    def _input_logprobs(self, seq: Seq, logits: torch.Tensor) -> None:
        """Log-probs of prompt tokens from logprob_start_len on, as SGLang returns them: position start is
        None, each later one log_softmax(logits / T) of its token given everything before it (T = 1 greedy)."""
        p, item = seq.params, seq.item
        temp = 1.0 if p.greedy else p.temperature
        start, n = max(item.logprob_start_len, 0), len(seq.prompt_ids)
        if start >= n:
            seq.input_logprobs, seq.input_top, seq.input_ids_lp = [], [], []
            return
        ids = torch.tensor(seq.prompt_ids[start + 1:n], device=logits.device, dtype=torch.long)
        lp = torch.log_softmax(logits[start:n - 1].float() / temp, dim=-1)  # row j predicts token start + j + 1
        seq.input_logprobs = [None, *lp.gather(1, ids.unsqueeze(1)).squeeze(1).tolist()]
        if item.top_logprobs_num:
            vals, idx = lp.topk(min(item.top_logprobs_num, lp.shape[1]), dim=-1)
            seq.input_top = [None, *(list(zip(v, i, strict=True)) for v, i in zip(vals.tolist(), idx.tolist(),
                                                                                 strict=True))]
        if item.token_ids_logprob:
            want = list(item.token_ids_logprob)
            rows = lp[:, torch.tensor(want, device=lp.device)].tolist()
            seq.input_ids_lp = [None, *(list(zip(r, want, strict=True)) for r in rows)]

    def score(self, seq: Seq) -> None:
        """Prefill-only scoring (max_new_tokens 0): input log-probs, nothing sampled, nothing kept."""
        if not self._needs_all_logits(seq):
            return
        ids = torch.tensor([seq.prompt_ids], dtype=torch.long, device=self.device)
        pos = torch.arange(len(seq.prompt_ids), device=self.device).unsqueeze(0)
        logits = self._forward(ids, None, pos, BatchCache(self.num_layers), keep=0)
        self._input_logprobs(seq, logits[0])

    def decode(self) -> torch.Tensor:
        """One step for every running row; returns logits [rows, vocab]."""
        assert self.cache is not None
        length = self.cache.length
        dev = self.device
        ids = torch.tensor([[s.output_ids[-1]] for s in self.rows], dtype=torch.long, device=dev)
        pos = torch.tensor([[length - p] for p in self.pads], dtype=torch.long, device=dev)
        if self.decoder is not None:
            return self.decoder.step(ids, pos, self.pads, self.cache)
        mask = None
        if any(self.pads):
            mask = torch.ones((len(self.rows), length + 1), dtype=torch.long)
            for i, p in enumerate(self.pads):
                if p:
                    mask[i, :p] = 0
            mask = mask.to(dev)
        return self._forward(ids, mask, pos, self.cache)[:, -1, :]

    def extend(self, seqs: list[Seq]) -> torch.Tensor:
        """Rows with several tokens not yet in the cache (grammar-forced tokens appended without a decode step):
        each leaves the batch with its keys/values, runs its uncached tokens in one forward and joins again.
        Returns next-token logits [len(seqs), vocab]; the invariant holds again afterwards."""
        assert self.cache is not None
        length = self.cache.length
        layers = [layer.valid() for layer in self.cache.slot_layers]
        where = {s.uid: i for i, s in enumerate(self.rows)}
        kept = []
        for s in seqs:
            i, pad = where[s.uid], self.pads[where[s.uid]]
            kv = [(k[i:i + 1, :, pad:length].clone(), v[i:i + 1, :, pad:length].clone()) for k, v in layers]
            kept.append((s, length - pad, kv, s.kv_weights))
        leaving = {s.uid for s in seqs}
        self._drop([s.uid not in leaving for s in self.rows])
        out = []
        for s, cached, kv, generation in kept:
            out.append(self._prefill_cached(s, cached, kv))
            s.kv_weights = generation  # its older keys/values stay marked as such (prefix cache guard)
        return torch.stack(out)

    def save(self, rows: list[int]) -> None:
        """Hand these rows' keys/values (their context minus the last sampled token) to the prefix cache."""
        if self.prefix is None or self.cache is None:
            return
        length = self.cache.length
        layers = [layer.valid() for layer in self.cache.slot_layers]
        for i in rows:
            n = length - self.pads[i]
            if n < self.prefix.min_tokens or self.rows[i].kv_weights != self.weights:
                continue  # too short to be worth it, or kept through a weight update (paused in place)
            kv = [(k[i:i + 1, :, self.pads[i]:length].clone(), v[i:i + 1, :, self.pads[i]:length].clone())
                  for k, v in layers]
            self.prefix.put(self.rows[i].context()[:n], kv)

    def remove(self, keep: list[bool]) -> None:
        """Drop rows whose keep flag is False, and the padding columns no remaining row needs."""
        if all(keep):
            return
        self.save([i for i, k in enumerate(keep) if not k])
        self._drop(keep)

    def _drop(self, keep: list[bool]) -> None:
        idx = [i for i, k in enumerate(keep) if k]
        if not idx:
            self.clear()
            return
        trim = min(self.pads[i] for i in idx)
        assert self.cache is not None
        self.cache.select_rows(torch.tensor(idx, device=self.device), trim_left=trim)
        self.rows = [self.rows[i] for i in idx]
        self.pads = [self.pads[i] - trim for i in idx]

    def clear(self) -> None:
        self.rows, self.pads, self.cache = [], [], None
