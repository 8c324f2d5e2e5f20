"""Validation of SGLang-style /generate bodies into per-sequence work items.

Every rule names the offending field, so a client sees `sampling_params[1].top_p: ...` rather than a 500.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from slimecli.config.decode import (
    MISSING,
    NO_SPEC,
    REQUEST,
    Spec,
    decode,
    decode_value,
    field_specs,
    field_types,
    message,
    request,
    spec,
)
from slimecli.config.errors import FieldError
from slimecli.engine import compat
from slimecli.engine.compat import CompatError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")
V = TypeVar("V")  # the type a single value decodes to

MAX_N = 256
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # what a torch generator's manual_seed takes
MIN_REPETITION = 1e-6
VOCAB = "vocab_size"  # a bound known per engine: decode(..., request(vocab_size=...))
VOCAB_NOTE = "token ids of the vocabulary"
TOKEN_ID = Spec(ge=0, lt=VOCAB, note=VOCAB_NOTE)
NONEMPTY = Spec(nonempty=True)

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
    """`sampling_params` of /generate, decoded by the one decoder; the fields from `constraint` on are built by
    compat.py and the constraint check (they need more than a type and bounds)."""

    max_new_tokens: int = spec(128, ge=0)
    temperature: float = spec(1.0, ge=0)
    top_p: float = spec(1.0, gt=0, le=1)
    top_k: int = spec(-1, ge=1, also=(-1,), note="-1: all")
    min_p: float = spec(0.0, ge=0, le=1)
    stop: tuple[str, ...] = spec((), one_or_many=True, nonempty=True)
    stop_token_ids: frozenset[int] = spec(frozenset(), ge=0, lt=VOCAB, note=VOCAB_NOTE)
    min_new_tokens: int = spec(0, ge=0)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = spec(1, ge=1, le=MAX_N)
    # logits / penalty must stay finite in float32 (below ~1e-20 a seen token's logit overflows)
    repetition_penalty: float = spec(1.0, ge=MIN_REPETITION, le=2)
    frequency_penalty: float = spec(0.0, ge=-2, le=2)
    presence_penalty: float = spec(0.0, ge=-2, le=2)
    sampling_seed: int | None = spec(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])  # what a torch generator takes
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


@dataclass(frozen=True)
class PromptOptions:
    """The per-prompt fields of /generate: one value for every prompt or, in a batch, a list of one each."""

    return_logprob: bool = False
    logprob_start_len: int = spec(-1, ge=-1)
    top_logprobs_num: int = spec(0, ge=0)
    return_text_in_logprobs: bool = False


def _check(errors: list[FieldError]) -> None:
    if errors:
        raise BadRequest(message(errors))


def parse_body(cls: type[T], body: dict[str, Any]) -> T:
    """A control endpoint's JSON body as its dataclass; BadRequest naming every bad, missing or unknown field."""
    errors: list[FieldError] = []
    out = decode(cls, body, "", errors, REQUEST)
    _check(errors)
    assert out is not None  # not built only when a field is missing, which is an error
    return out


def _decoded(value: object, tp: type[V], where: str, fs: Spec = NO_SPEC, vocab_size: int = 0) -> V:
    """One value through the decoder; BadRequest naming every problem."""
    errors: list[FieldError] = []
    out: V = decode_value(value, tp, where, errors, fs, request(vocab_size=vocab_size))
    _check(errors)
    return out


def token_ids(where: str, v: Any, vocab_size: int) -> list[int]:
    if not isinstance(v, list):
        raise BadRequest(f"{where}: must be a list of token ids")
    if not v:
        raise BadRequest(f"{where}: is empty")
    return _decoded(v, list[int], where, TOKEN_ID, vocab_size)


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
    errors: list[FieldError] = []
    params = decode(SamplingParams, {k: v for k, v in raw.items() if k in SAMPLING_KEYS}, where, errors,
                    request(vocab_size=vocab_size))
    _check(errors)
    assert params is not None  # every field has a default
    if params.min_new_tokens > params.max_new_tokens:
        raise BadRequest(f"{where}.min_new_tokens: larger than max_new_tokens")
    return replace(params, **kw) if kw else params  # a copy costs a third of the parse, per item of every request


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
        batched = isinstance(text, list)
        if batched and not text:
            raise BadRequest("text: the batch is empty")
        texts = _decoded(text, list[str], "text", NONEMPTY) if batched else [_decoded(text, str, "text", NONEMPTY)]
        prompts = [(None, t) for t in texts]
    count = len(prompts)

    raw_sp = body.get("sampling_params")
    if batched and isinstance(raw_sp, list):
        sps = [parse_sampling(f"sampling_params[{i}]", s, vocab_size)
               for i, s in enumerate(_per_item("sampling_params", raw_sp, count, True))]
    else:
        sps = [parse_sampling("sampling_params", raw_sp, vocab_size)] * count

    options = _prompt_options(body, count, batched)
    flags = {key: _decoded(body[key], bool, key) if body.get(key) is not None else False
             for key in ("return_prompt_token_ids", "stream")}
    try:
        compat.check_watermark("watermark", body.get("watermark"))
        if body.get("watermark") is not None and any(isinstance(s, dict) and s.get("watermark") is not None
                                                     for s in (raw_sp if isinstance(raw_sp, list) else [raw_sp])):
            raise CompatError("watermark: give it at the top level or in sampling_params, not both")
        tids = compat.token_ids_logprob(body.get("token_ids_logprob"), count, any(s.n > 1 for s in sps), vocab_size)
    except CompatError as exc:
        raise BadRequest(str(exc)) from None
    rid = body.get("rid")
    rids: list[str | None]
    if rid is None:
        rids = [None] * count
    elif batched:
        if not isinstance(rid, list) or len(rid) != count:
            raise BadRequest(f"rid: must be a list of {count} strings for this batch")
        rids = _decoded(rid, list[str | None], "rid", NONEMPTY)
    else:
        rids = [_decoded(rid, str, "rid", NONEMPTY)]
    given = [r for r in rids if r is not None]
    if len(set(given)) != len(given):
        raise BadRequest("rid: duplicate request ids in one request")

    items: list[Item] = []
    for i, ((pids, ptext), sp) in enumerate(zip(prompts, sps, strict=True)):
        group = rids[i] or f"req-{next(_AUTO_RID)}"
        for j in range(sp.n):
            items.append(Item(index=len(items), rid=group if sp.n == 1 else f"{group}-{j}", prompt_ids=pids,
                              text=ptext, params=sp, return_logprob=options[i].return_logprob,
                              logprob_start_len=options[i].logprob_start_len,
                              top_logprobs_num=options[i].top_logprobs_num,
                              return_text_in_logprobs=options[i].return_text_in_logprobs, token_ids_logprob=tids[i],
                              return_prompt_token_ids=flags["return_prompt_token_ids"], group=group,
                              extra={"copy": j}))
    return GenerateRequest(items=items, batched=batched or sps[0].n > 1 or any(s.n > 1 for s in sps),
                           stream=flags["stream"])


def _prompt_options(body: dict[str, Any], count: int, batched: bool) -> list[PromptOptions]:
    """PromptOptions of each prompt; a list value is one per batch entry, named `field[i]` in errors."""
    hints, specs = field_types(PromptOptions), field_specs(PromptOptions)
    errors: list[FieldError] = []
    columns: dict[str, list[Any]] = {}
    for name, tp in hints.items():
        raw = body.get(name)
        if batched and isinstance(raw, list):
            values = _per_item(name, raw, count, batched)
            columns[name] = [MISSING if v is None else decode_value(v, tp, f"{name}[{i}]", errors, specs[name], REQUEST)
                             for i, v in enumerate(values)]
        else:
            columns[name] = [MISSING if raw is None else decode_value(raw, tp, name, errors, specs[name], REQUEST)] * count
    _check(errors)
    return [PromptOptions(**{k: col[i] for k, col in columns.items() if col[i] is not MISSING}) for i in range(count)]
