"""Structured outputs: regex / json_schema / ebnf constraints as per-sequence matchers and next-token masks.

Backed by llguidance: of the libraries measured by bench/bench_grammar.py on the engine's tokenizer it
compiles fastest, masks within a few tens of microseconds a token, handles all three kinds and depends
on nothing else. A grammar compiles once per (kind, text) into a matcher in its start state (the cache
keeps the most recent ones); every sequence advances its own copy. The matcher's end-of-text tokens are
the engine's EOS ids: an accepting grammar allows them, a finished one allows nothing else, so a
constrained output ends with EOS like any other.

JSON schemas default to compact output (`{"a": 1, "b": 2}`, the separators of Python's json.dumps); a
schema may ask for free whitespace with `"x-guidance": {"whitespace_flexible": true}`.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

import torch

from slimecli.engine.protocol import BadRequest, Constraint

if TYPE_CHECKING:
    from llguidance import LLExecutor, LLMatcher, LLTokenizer
    from llguidance._lib import JsonCompileOptions

CACHE_SIZE = 256
JSON_DEFAULTS: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_MESSAGE = 600


class Matcher:
    """One sequence's position in its grammar (used by the scheduler thread only).

    It keeps what it learnt about its state until it consumes a token: the next token's mask (`prime`, for a
    whole batch at once: the jump-forward check after a sampled token and the next step's draw read the same
    mask), the one token that mask allows if it allows one, and the grammar-forced run found from here (which
    stays true, one token shorter, as the matcher consumes the run's own tokens)."""

    __slots__ = ("_m", "eos", "vocab", "_words", "_forced", "_run", "_run_ends")

    def __init__(self, m: LLMatcher, eos: tuple[int, ...], vocab: int) -> None:
        self._m, self.eos, self.vocab = m, eos, vocab  # vocab: the width of the matcher's masks
        self._words: torch.Tensor | None = None  # the next token's mask, 32 token ids to an int32 word
        self._forced: int | None = None  # the one token that mask allows, if it allows exactly one
        self._run: list[int] | None = None  # the forced tokens from here (forced_run), when known
        self._run_ends = False  # ... and no token is forced after them

    def consume(self, token: int) -> bool:
        self._words = None
        self._run = self._run[1:] if self._run and self._run[0] == token else None
        return bool(self._m.consume_token(token))

    def copy(self) -> Matcher:
        return Matcher(self._m.deep_copy(), self.eos, self.vocab)

    @property
    def stopped(self) -> bool:
        """Nothing but end-of-text can follow (also true once EOS was consumed)."""
        return bool(self._m.is_stopped())

    @property
    def error(self) -> str:
        return str(self._m.get_error())


class Compiled:
    """A grammar compiled for the tokenizer: a start-state matcher that is copied, never advanced."""

    def __init__(self, m: LLMatcher, eos: tuple[int, ...], vocab: int) -> None:
        self._m, self.eos, self.vocab = m, eos, vocab

    def matcher(self) -> Matcher:
        return Matcher(self._m.deep_copy(), self.eos, self.vocab)


def _lark(kind: str, text: str) -> str:
    """The llguidance grammar for a constraint; ValueError when the text is not even of its kind."""
    import llguidance

    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(text)
    if kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_DEFAULTS)
    return llguidance.grammar_from("ebnf", text)


def _short(message: str) -> str:
    message = message.strip()
    return message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE] + " ..."


class GrammarCache:
    """Compiles constraints (blocking: call it from a worker thread) and keeps the most recent ones.

    Failures are cached too, so a client repeating a bad grammar costs a dictionary look-up.
    """

    def __init__(self, tokenizer_factory: Callable[[], Any], vocab_size: int, eos_ids: Iterable[int],
                 size: int = CACHE_SIZE) -> None:
        self._factory = tokenizer_factory
        self.vocab_size = vocab_size
        self.eos = tuple(sorted(eos_ids))
        self.size = size
        self._tokenizer: LLTokenizer | None = None
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[tuple[str, str], Compiled | str] = collections.OrderedDict()

    def _ll_tokenizer(self) -> LLTokenizer:
        with self._lock:
            if self._tokenizer is None:
                import llguidance.hf

                hf = self._factory()  # its own instance: a fast tokenizer must not be shared across threads
                self._tokenizer = llguidance.hf.from_tokenizer(hf, n_vocab=max(self.vocab_size, len(hf)),
                                                               eos_token=list(self.eos) or None)
            return self._tokenizer

    def compile(self, c: Constraint) -> Compiled:
        """The compiled grammar, or BadRequest naming the request field."""
        key = (c.kind, c.text)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
        if hit is None:
            hit = self._compile(c)
            with self._lock:
                self._cache[key] = hit
                while len(self._cache) > self.size:
                    self._cache.popitem(last=False)
        if isinstance(hit, str):
            raise BadRequest(f"{c.where or c.kind}: {hit}")
        return hit

    def _compile(self, c: Constraint) -> Compiled | str:
        import llguidance

        what = {"regex": "invalid regex", "json_schema": "invalid JSON schema", "ebnf": "invalid EBNF grammar"}[c.kind]
        tok = self._ll_tokenizer()
        try:
            m = llguidance.LLMatcher(tok, _lark(c.kind, c.text), log_level=0)
        except (ValueError, RuntimeError, TypeError) as exc:  # text not of its kind (e.g. not JSON)
            return f"{what}: {_short(str(exc))}"
        if m.is_error():
            return f"{what}: {_short(m.get_error())}"
        return Compiled(m, self.eos, tok.vocab_size)


_EXECUTOR: LLExecutor | None = None


def _executor() -> LLExecutor:
    global _EXECUTOR
    if _EXECUTOR is None:
        import llguidance

        _EXECUTOR = llguidance.LLExecutor()
    return _EXECUTOR


BITS = torch.arange(32, dtype=torch.int32)


def prime(matchers: list[Matcher]) -> None:
    """Compute the next-token masks of the matchers that have none (in parallel for a batch), and which of them
    allow exactly one token."""
    todo = [m for m in matchers if m._words is None]
    if not todo:
        return
    words = (todo[0].vocab + 31) // 32  # one tokenizer for all: every matcher has the same width
    bitmask = torch.zeros((len(todo), words), dtype=torch.int32)
    if len(todo) == 1:
        todo[0]._m.unsafe_compute_mask_ptr(bitmask.data_ptr(), words * 4)
        set_words = bitmask[0].nonzero()
        counts, firsts = [set_words.numel()], [int(set_words[0, 0]) if set_words.numel() else 0]
    else:
        _executor().unsafe_compute_mask_ptr([(m._m, i) for i, m in enumerate(todo)], bitmask.data_ptr(),
                                            words * 4, len(todo))
        nonzero = bitmask != 0
        counts, firsts = nonzero.sum(-1).tolist(), nonzero.to(torch.uint8).argmax(-1).tolist()
    for i, m in enumerate(todo):
        m._words, m._forced = bitmask[i], None
        if counts[i] == 1:
            bits = int(bitmask[i, firsts[i]]) & 0xFFFFFFFF
            if not bits & (bits - 1):  # one bit of one word: one token
                m._forced = firsts[i] * 32 + bits.bit_length() - 1


def forced_token(m: Matcher) -> int | None:
    """The one token the grammar allows next, or None when it allows several (or none).

    A forced token is what the sampler would pick with certainty: the masked distribution puts all its mass
    on it, so its log-prob is exactly 0 whatever the logits. The scheduler appends such tokens without a
    decode step (jump-forward over the literal parts of a grammar).
    """
    if m._run:
        return m._run[0]
    prime([m])
    return m._forced


def forced_run(m: Matcher, limit: int) -> list[int]:
    """The tokens the grammar forces in a row from here, up to `limit` of them (found on a copy of the matcher,
    and kept by the matcher: a row that rides along a forced stretch is not probed again at every token)."""
    if limit <= 0:
        return []
    if m._run is not None and (m._run_ends or len(m._run) >= limit):
        return m._run[:limit]
    run: list[int] = []
    tok = forced_token(m)
    if tok is not None:
        probe = m.copy()
        while tok is not None and len(run) < limit and probe.consume(tok):
            run.append(tok)
            tok = forced_token(probe)
    m._run, m._run_ends = run, len(run) < limit
    return list(run)


def allowed_tokens(matchers: list[Matcher], vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[len(matchers), vocab] bool: the tokens each matcher accepts next (computed where not yet known, in
    parallel for a batch).

    A matcher that allows nothing (it cannot happen with a valid state) gets its EOS ids, so it ends.
    """
    prime(matchers)
    bitmask = torch.stack([cast(torch.Tensor, m._words) for m in matchers])
    allowed = ((bitmask.unsqueeze(-1) >> BITS) & 1).bool().view(len(matchers), -1)[:, :vocab]
    if allowed.shape[1] < vocab:  # logits wider than the tokenizer: the extra ids are never allowed
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]))
    empty = (~allowed.any(-1)).nonzero().flatten().tolist()
    for i in empty:
        eos = [t for t in matchers[i].eos if t < vocab]
        if eos:
            allowed[i, eos] = True
        else:
            allowed[i] = True  # the next token is then rejected and the sequence aborted
    return allowed.to(device, non_blocking=True)
