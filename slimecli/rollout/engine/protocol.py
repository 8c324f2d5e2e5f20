"""Validation of SGLang-style /generate bodies into per-sequence work items.

Every rule names the offending field, so a client sees `sampling_params[1].top_p: ...` rather than a 500.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from slimecli.rollout.engine import compat
from slimecli.rollout.engine.compat import CompatError

MAX_N = 256

# Top-level /generate keys we honour; compat.py lists the other fields SGLang knows and what happens to them.
GENERATE_KEYS = {"text", "input_ids", "sampling_params", "return_logprob", "logprob_start_len", "top_logprobs_num",
                 "rid", "stream", "return_text_in_logprobs", *compat.EXTRA_GENERATE_KEYS}
SAMPLING_KEYS = {"max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids",
                 "min_new_tokens", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
                 "no_stop_trim", "n", "repetition_penalty", "frequency_penalty", "presence_penalty", "sampling_seed"}
# Structured outputs: at most one per request, compiled by the engine's grammar module.
CONSTRAINT_KEYS = ("regex", "json_schema", "ebnf")


class BadRequest(ValueError):
    """A client error: answered with 400 {"error": {"message": ...}}."""


@dataclass(frozen=True)
class Constraint:
    """A grammar the output must follow; (kind, text) is the compile-cache key."""

    kind: str  # one of CONSTRAINT_KEYS
    text: str
    where: str = field(default="", compare=False)  # the request field, for error messages


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    min_new_tokens: int = 0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    sampling_seed: int | None = None
    constraint: Constraint | None = None
    stop_regex: tuple[str, ...] = ()
    stop_regex_window: int = 0  # characters a stop_regex match can span; 0 = unbounded
    logit_bias: tuple[tuple[int, float], ...] = ()
    stream_interval: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    @property
    def penalized(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
                or bool(self.logit_bias))


@dataclass
class Item:
    """One sequence to generate (a batch entry, or one of its n copies)."""

    index: int  # position in the reply list
    rid: str
    prompt_ids: list[int] | None
    text: str | None
    params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    token_ids_logprob: tuple[int, ...] | None = None
    return_prompt_token_ids: bool = False
    group: str = ""  # the rid given by the client; abort by rid reaches every copy
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class GenerateRequest:
    items: list[Item]
    batched: bool  # reply with a list
    stream: bool


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an integer too large for a float
        return False


def _show(v: Any) -> str:
    """A value for an error message, cut short (a 4000-digit integer, a megabyte string)."""
    text = repr(v) if not isinstance(v, int) or abs(v) < 10 ** 30 else f"an integer of {len(str(abs(v)))} digits"
    return text if len(text) <= 80 else text[:77] + "..."


def _num(where: str, v: Any, lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> float:
    if not _is_num(v):
        raise BadRequest(f"{where}: must be a finite number (got {_show(v)})")
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise BadRequest(f"{where}: must be {'>' if lo_open else '>='} {lo} (got {_show(v)})")
    if hi is not None and v > hi:
        raise BadRequest(f"{where}: must be <= {hi} (got {_show(v)})")
    return float(v)


def _int(where: str, v: Any, lo: int | None = None, hi: int | None = None) -> int:
    if not _is_int(v):
        raise BadRequest(f"{where}: must be an integer (got {_show(v)})")
    if lo is not None and v < lo:
        raise BadRequest(f"{where}: must be >= {lo} (got {_show(v)})")
    if hi is not None and v > hi:
        raise BadRequest(f"{where}: must be <= {hi} (got {_show(v)})")
    return v


SEED_RANGE = (-(1 << 63), (1 << 64) - 1)
MIN_REPETITION = 1e-6  # what a torch generator's manual_seed takes


def _bool(where: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise BadRequest(f"{where}: must be true or false (got {v!r})")
    return v


def token_ids(where: str, v: Any, vocab_size: int) -> list[int]:
    if not isinstance(v, list):
        raise BadRequest(f"{where}: must be a list of token ids")
    if not v:
        raise BadRequest(f"{where}: is empty")
    for i, t in enumerate(v):
        if not _is_int(t):
            raise BadRequest(f"{where}[{i}]: token ids must be integers (got {t!r})")
        if not 0 <= t < vocab_size:
            raise BadRequest(f"{where}[{i}]: token id {t} is outside the vocabulary [0, {vocab_size})")
    return v


def parse_sampling(where: str, raw: Any, vocab_size: int) -> SamplingParams:
    if raw is None:
        return SamplingParams()
    if not isinstance(raw, dict):
        raise BadRequest(f"{where}: must be an object")
    unknown = sorted(k for k in raw if k not in SAMPLING_KEYS and k not in CONSTRAINT_KEYS
                     and k not in compat.COMPAT_SAMPLING_KEYS)
    if unknown:
        raise BadRequest(f"{where}: unsupported key(s) {', '.join(unknown)}")
    try:
        kw: dict[str, Any] = compat.sampling_extras(where, raw, vocab_size)
    except CompatError as exc:
        raise BadRequest(str(exc)) from None
    if (constraint := _constraint(where, raw)) is not None:
        kw["constraint"] = constraint
    g = {k: v for k, v in raw.items() if k in SAMPLING_KEYS and v is not None}
    if "max_new_tokens" in g:
        kw["max_new_tokens"] = _int(f"{where}.max_new_tokens", g["max_new_tokens"], 0)
    if "temperature" in g:
        kw["temperature"] = _num(f"{where}.temperature", g["temperature"], 0.0)
    if "top_p" in g:
        kw["top_p"] = _num(f"{where}.top_p", g["top_p"], 0.0, 1.0, lo_open=True)
    if "top_k" in g:
        k = _int(f"{where}.top_k", g["top_k"])
        if k == 0 or k < -1:
            raise BadRequest(f"{where}.top_k: must be -1 (all) or >= 1 (got {k})")
        kw["top_k"] = k
    if "min_p" in g:
        kw["min_p"] = _num(f"{where}.min_p", g["min_p"], 0.0, 1.0)
    if "stop" in g:
        stop = g["stop"]
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise BadRequest(f"{where}.stop: must be a string or a list of strings")
        if any(s == "" for s in stops):
            raise BadRequest(f"{where}.stop: stop strings must not be empty")
        kw["stop"] = tuple(stops)
    if "stop_token_ids" in g:
        ids = g["stop_token_ids"]
        if not isinstance(ids, list):
            raise BadRequest(f"{where}.stop_token_ids: must be a list of token ids")
        kw["stop_token_ids"] = frozenset(token_ids(f"{where}.stop_token_ids", ids, vocab_size) if ids else [])
    for key in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"):
        if key in g:
            kw[key] = _bool(f"{where}.{key}", g[key])
    if "n" in g:
        n = _int(f"{where}.n", g["n"], 1)
        if n > MAX_N:
            raise BadRequest(f"{where}.n: at most {MAX_N} (got {n})")
        kw["n"] = n
    if "min_new_tokens" in g:
        kw["min_new_tokens"] = _int(f"{where}.min_new_tokens", g["min_new_tokens"], 0)
    if "repetition_penalty" in g:
        # logits / penalty must stay finite in float32 (below ~1e-20 a seen token's logit overflows)
        kw["repetition_penalty"] = _num(f"{where}.repetition_penalty", g["repetition_penalty"], MIN_REPETITION, 2.0)
    for key in ("frequency_penalty", "presence_penalty"):
        if key in g:
            kw[key] = _num(f"{where}.{key}", g[key], -2.0, 2.0)
    if "sampling_seed" in g:
        kw["sampling_seed"] = _int(f"{where}.sampling_seed", g["sampling_seed"], *SEED_RANGE)
    params = SamplingParams(**kw)
    if params.min_new_tokens > params.max_new_tokens:
        raise BadRequest(f"{where}.min_new_tokens: larger than max_new_tokens")
    return params


def _constraint(where: str, raw: dict[str, Any]) -> Constraint | None:
    """regex / json_schema / ebnf: a non-empty string, at most one of them (whether it compiles is checked later)."""
    given = [k for k in CONSTRAINT_KEYS if raw.get(k) is not None]
    if len(given) > 1:
        raise BadRequest(f"{where}: {', '.join(given)} exclude each other: give at most one of them")
    if not given:
        return None
    kind = given[0]
    text = raw[kind]
    if not isinstance(text, str):
        what = "a JSON schema serialised as a string" if kind == "json_schema" else "a string"
        raise BadRequest(f"{where}.{kind}: must be {what} (got {type(text).__name__})")
    if not text.strip():
        raise BadRequest(f"{where}.{kind}: is empty")
    return Constraint(kind, text, f"{where}.{kind}")


def _per_item(name: str, value: Any, count: int, batched: bool) -> list[Any]:
    """A scalar applies to every batch entry; a list must have one value per entry."""
    if batched and isinstance(value, list):
        if len(value) != count:
            raise BadRequest(f"{name}: has {len(value)} entries for a batch of {count}")
        return value
    return [value] * count


_AUTO_RID = itertools.count()


def parse_generate(body: Any, vocab_size: int) -> GenerateRequest:
    if not isinstance(body, dict):
        raise BadRequest("body: must be a JSON object")
    unknown = sorted(k for k, v in body.items() if k not in GENERATE_KEYS and k not in compat.IGNORED_KEYS
                     and not (k in compat.INERT_KEYS and v in (None, False, [], {}, "")))
    if unknown:
        raise BadRequest(f"unsupported field(s): {', '.join(unknown)}")
    text, ids = body.get("text"), body.get("input_ids")
    if text is None and ids is None:
        raise BadRequest("text / input_ids: one of them is required")
    if text is not None and ids is not None:
        raise BadRequest("text / input_ids: give only one of them")
    prompts: list[tuple[list[int] | None, str | None]]
    if ids is not None:
        if not isinstance(ids, list) or not ids:
            raise BadRequest("input_ids: must be a non-empty list of token ids (or a list of such lists)")
        batched = isinstance(ids[0], list)
        if batched:
            prompts = [(token_ids(f"input_ids[{i}]", x, vocab_size), None) for i, x in enumerate(ids)]
        else:
            prompts = [(token_ids("input_ids", ids, vocab_size), None)]
    else:
        assert text is not None  # checked above: one of text / input_ids is given
        batched = isinstance(text, list)
        texts = text if batched else [text]
        if batched and not texts:
            raise BadRequest("text: the batch is empty")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise BadRequest(f"text{f'[{i}]' if batched else ''}: must be a string")
            if not t:
                raise BadRequest(f"text{f'[{i}]' if batched else ''}: is empty")
        prompts = [(None, t) for t in texts]
    count = len(prompts)

    raw_sp = body.get("sampling_params")
    if batched and isinstance(raw_sp, list):
        sps = [parse_sampling(f"sampling_params[{i}]", s, vocab_size)
               for i, s in enumerate(_per_item("sampling_params", raw_sp, count, True))]
    else:
        sps = [parse_sampling("sampling_params", raw_sp, vocab_size)] * count

    def opt(name: str, default: Any, check: Any) -> list[Any]:
        raw = body.get(name)
        vals = _per_item(name, default if raw is None else raw, count, batched)
        return [default if v is None else check(f"{name}[{i}]" if isinstance(raw, list) else name, v)
                for i, v in enumerate(vals)]

    return_logprob = opt("return_logprob", False, _bool)
    start_len = opt("logprob_start_len", -1, lambda w, v: _int(w, v, -1))
    top_n = opt("top_logprobs_num", 0, lambda w, v: _int(w, v, 0))
    text_in_lp = opt("return_text_in_logprobs", False, _bool)
    prompt_ids_back = _bool("return_prompt_token_ids", body.get("return_prompt_token_ids") or False)
    try:
        compat.check_watermark("watermark", body.get("watermark"))
        if body.get("watermark") is not None and any(isinstance(s, dict) and s.get("watermark") is not None
                                                     for s in (raw_sp if isinstance(raw_sp, list) else [raw_sp])):
            raise CompatError("watermark: give it at the top level or in sampling_params, not both")
        tids = compat.token_ids_logprob(body.get("token_ids_logprob"), count, any(s.n > 1 for s in sps), vocab_size)
    except CompatError as exc:
        raise BadRequest(str(exc)) from None
    stream = body.get("stream", False)
    stream = False if stream is None else _bool("stream", stream)

    rid = body.get("rid")
    if rid is None:
        rids = [None] * count
    elif batched:
        if not isinstance(rid, list) or len(rid) != count:
            raise BadRequest(f"rid: must be a list of {count} strings for this batch")
        rids = rid
    else:
        rids = [rid]
    for i, r in enumerate(rids):
        if r is not None and (not isinstance(r, str) or not r):
            raise BadRequest(f"rid{f'[{i}]' if batched else ''}: must be a non-empty string")
    given = [r for r in rids if r is not None]
    if len(set(given)) != len(given):
        raise BadRequest("rid: duplicate request ids in one request")

    items: list[Item] = []
    for i, ((pids, ptext), sp) in enumerate(zip(prompts, sps, strict=True)):
        group = rids[i] or f"req-{next(_AUTO_RID)}"
        for j in range(sp.n):
            items.append(Item(index=len(items), rid=group if sp.n == 1 else f"{group}-{j}", prompt_ids=pids,
                              text=ptext, params=sp, return_logprob=return_logprob[i],
                              logprob_start_len=start_len[i], top_logprobs_num=top_n[i],
                              return_text_in_logprobs=text_in_lp[i], token_ids_logprob=tids[i],
                              return_prompt_token_ids=prompt_ids_back, group=group,
                              extra={"copy": j}))
    return GenerateRequest(items=items, batched=batched or sps[0].n > 1 or any(s.n > 1 for s in sps), stream=stream)
