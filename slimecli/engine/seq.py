"""One sequence in the engine: its tokens, log-probs, stop rules, and the SGLang-shaped reply built from it."""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Required, TypedDict

import torch

from slimecli.engine.compat import weight_version_spans
from slimecli.engine.grammar import Matcher
from slimecli.engine.protocol import Item, SamplingParams
from slimecli.engine.sampling import RowState, make_generator

_UID = itertools.count()
Pairs = list[tuple[float, int]]  # (log-prob, token id) at one position: its top tokens, or the ids asked for
Entry = list[float | int | str | None]  # one log-prob in a reply: [log-prob, token id, its text or null]


class FinishReason(TypedDict, total=False):
    """SGLang's meta_info.finish_reason: why a sequence ended."""

    type: Required[Literal["stop", "length", "abort"]]
    matched: int | str | None  # stop: the EOS / stop token id, stop string or stop_regex pattern (None: a grammar's end)
    length: int  # length: the max_new_tokens reached
    message: str  # abort: why


@dataclass(eq=False)
class Seq:
    item: Item
    prompt_ids: list[int]
    eos_ids: frozenset[int]
    # Runs on the event loop for each update: (seq, tokens so far, finish reason at that moment). The scheduler
    # thread keeps appending, so readers use the snapshot length, never len(output_ids).
    notify: Callable[[Seq, int, FinishReason | None], None] | None = None
    stream: bool = False
    uid: int = field(default_factory=lambda: next(_UID))
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # with return_logprob only, as top and ids_lp
    top: list[Pairs | None] = field(default_factory=list)
    ids_lp: list[Pairs | None] = field(default_factory=list)  # token_ids_logprob at each output position
    # From logprob_start_len on, SGLang-shaped: the first position is None (nothing before it is scored).
    input_logprobs: list[float | None] | None = None
    input_top: list[Pairs | None] | None = None
    input_ids_lp: list[Pairs | None] | None = None
    retractions: int = 0  # times a retract-mode pause sent it back to the queue
    version_events: list[tuple[str, int]] = field(default_factory=list)  # (old weight version, tokens then)
    finish: FinishReason | None = None
    started: float = field(default_factory=time.monotonic)
    weight_version: str = ""
    cached_tokens: int = 0  # prompt tokens whose keys/values came from the prefix cache
    kv_weights: int = -1  # the runner's weights generation its keys/values were computed with
    generator: torch.Generator | None = None
    grammar: Matcher | None = None  # regex / json_schema / ebnf: advanced with every sampled token
    _row: RowState | None = None

    @property
    def params(self) -> SamplingParams:
        return self.item.params

    @property
    def rid(self) -> str:
        return self.item.rid

    @property
    def done(self) -> bool:
        return self.finish is not None

    def context(self) -> list[int]:
        """Tokens whose keys/values must be in the cache before the next token is sampled."""
        return self.prompt_ids + self.output_ids

    def row(self, device: torch.device | str = "cpu") -> RowState:
        if self._row is None:
            self.generator = make_generator(self.params.sampling_seed, self.item.extra.get("copy", 0), device)
            lp = self.item.return_logprob
            self._row = RowState(self.params, self.generator, self.output_ids, self.prompt_ids, [],
                                 self.item.top_logprobs_num if lp else 0,
                                 self.item.token_ids_logprob if lp else None, logprob=lp)
        p = self.params
        blocked: list[int] = []
        if len(self.output_ids) < p.min_new_tokens:
            blocked = sorted(set(p.stop_token_ids) | (set() if p.ignore_eos else set(self.eos_ids)))
        self._row.blocked = blocked
        return self._row

    def append(self, token: int, logprob: float, top: Pairs | None, decode: Callable[[list[int]], str],
               ids_lp: Pairs | None = None) -> None:
        self.output_ids.append(token)
        if self.item.return_logprob:  # kept only where the reply reports them
            self.logprobs.append(logprob)
            if self.item.top_logprobs_num:
                self.top.append(top)
            if self.item.token_ids_logprob:
                self.ids_lp.append(ids_lp)
        p = self.params
        g = self.grammar
        if g is not None and not g.consume(token):  # the mask makes this unreachable; never emit off-grammar text
            self.finish = {"type": "abort", "message": f"grammar rejected token {token}: {g.error}"}
        elif not p.ignore_eos and token in self.eos_ids:
            self.finish = {"type": "stop", "matched": token}
        elif g is not None and g.stopped and (token in self.eos_ids or not self.eos_ids):
            self.finish = {"type": "stop", "matched": token if token in self.eos_ids else None}  # the grammar's end
        elif token in p.stop_token_ids:
            self.finish = {"type": "stop", "matched": token}
        elif p.stop and (hit := self._stop_string(decode)) is not None:
            self.finish = {"type": "stop", "matched": hit}
        elif p.stop_regex and (hit := self._stop_regex(decode)) is not None:
            self.finish = {"type": "stop", "matched": hit}  # SGLang reports the pattern, not the text
        elif len(self.output_ids) >= p.max_new_tokens:
            self.finish = {"type": "length", "length": p.max_new_tokens}

    def _stop_string(self, decode: Callable[[list[int]], str]) -> str | None:
        longest = max(len(s) for s in self.params.stop)
        tail = decode(self.output_ids[-(longest + 4):])
        hits = [(tail.find(s), s) for s in self.params.stop if s in tail]
        return min(hits)[1] if hits else None

    def _stop_regex(self, decode: Callable[[list[int]], str]) -> str | None:
        w = self.params.stop_regex_window
        tail = decode(self.output_ids[-(w + 4):] if w else self.output_ids)
        return next((p for p in self.params.stop_regex if re.search(p, tail)), None)

    def abort(self, message: str) -> None:
        if self.finish is None:
            self.finish = {"type": "abort", "message": message}


def _entry(lp: float | None, tid: int, decode_one: Callable[[int], str] | None) -> Entry:
    return [lp, tid, decode_one(tid) if decode_one else None]


def _entries(pairs: Pairs | None, decode_one: Callable[[int], str] | None) -> list[Entry] | None:
    """One position's top / token_ids log-probs: [[logprob, id, text], ...], or None (SGLang's empty slot)."""
    return [_entry(lp, t, decode_one) for lp, t in pairs] if pairs else None


def build_reply(seq: Seq, tokenizer: Any, weight_version: str, n: int | None = None,
                finish: FinishReason | None = None) -> dict[str, Any]:
    """The /generate reply dict for one sequence, or for its first n tokens (a streamed chunk, cumulative).

    Keys as SGLang's TokenizerManager._handle_batch_output builds them; e2e_latency and weight_versions only
    once finished, the log-prob lists only with return_logprob (input ones empty without logprob_start_len).
    """
    p = seq.params
    if n is None:
        n, finish = len(seq.output_ids), seq.finish
    ids = seq.output_ids[:n]
    fin = finish
    text_ids = ids
    matched = fin.get("matched") if fin and fin["type"] == "stop" else None
    if isinstance(matched, int) and not p.no_stop_trim and ids:
        text_ids = ids[:-1]
    text = tokenizer.decode(text_ids, skip_special_tokens=p.skip_special_tokens) if text_ids else ""
    if isinstance(matched, str):
        cut = text.find(matched)
        if cut >= 0:
            text = text[:cut + len(matched)] if p.no_stop_trim else text[:cut]
    wv = seq.weight_version or weight_version
    meta: dict[str, Any] = {
        "id": seq.rid,
        "finish_reason": fin,
        "prompt_tokens": len(seq.prompt_ids),
        "weight_version": wv,
        "num_retractions": seq.retractions,
        "reasoning_tokens": 0,  # no reasoning parser here
        "completion_tokens": len(ids),
        "cached_tokens": seq.cached_tokens,
    }
    item = seq.item
    if item.return_logprob:
        one = (lambda t: tokenizer.decode([t])) if item.return_text_in_logprobs else None
        start = max(item.logprob_start_len, 0)
        meta["input_token_logprobs"] = [_entry(lp, t, one) for lp, t in
                                        zip(seq.input_logprobs or [], seq.prompt_ids[start:], strict=False)]
        meta["output_token_logprobs"] = [_entry(lp, t, one) for lp, t in zip(seq.logprobs[:n], ids, strict=True)]
        meta["output_token_logprobs_length"] = len(ids)
        if item.top_logprobs_num:
            meta["input_top_logprobs"] = [_entries(x, one) for x in seq.input_top or []]
            meta["output_top_logprobs"] = [_entries(x, one) or [] for x in seq.top[:n]]
        if item.token_ids_logprob is not None:
            meta["input_token_ids_logprobs"] = [_entries(x, one) for x in seq.input_ids_lp or []]
            meta["output_token_ids_logprobs"] = [_entries(x, one) or [] for x in seq.ids_lp[:n]]
    if fin is not None:
        meta["weight_versions"] = weight_version_spans(seq.version_events, wv, len(ids))
        meta["e2e_latency"] = time.monotonic() - seq.started
    out = {"text": text, "output_ids": list(ids), "meta_info": meta}
    if item.return_prompt_token_ids:
        out["prompt_token_ids"] = list(seq.prompt_ids)
    return out
