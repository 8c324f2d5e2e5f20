"""Validation of teacher-server request bodies: every malformed field is a 4xx with a message, never a 500.

The reference server let ids outside the vocabulary reach the model (wrong results or a crash on a
TP rank, which hangs its peers); here nothing reaches a worker before it has been checked.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from slimecli.config.decode import REQUEST, decode, decode_value, field_specs, finite, is_int, message, request, spec
from slimecli.config.errors import FieldError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")

MAX_SAMPLE_N = 4096
MAX_SAMPLED = 1 << 24  # (len(input_ids) - 1) x sample_n: sampled ids one reply may carry
MAX_LABEL_WIDTH = 256  # label_token_ids per position
# Where log-softmax(logits / T) stays finite in every dtype a teacher runs in (fp16 included); the issue
# that a 1e-40 temperature showed: logits / T overflow to inf, and the log-probs turn to NaN.
TEMPERATURE_RANGE = (1e-2, 1e2)
VOCAB = "vocab_size"  # a bound known per server: request(vocab_size=...)
VOCAB_NOTE = "token ids of the vocabulary"
# timeout_s: THUDM/slime's teacher warm-up sends it to /generate; its server accepts it there and bounds nothing
# with it (it is the deadline of an update_weights_from_disk), so it is checked and accepted, as there.
GENERATE_KEYS = frozenset({"input_ids", "sample_n", "label_token_ids", "temperature", "timeout_s"})
UPDATE_KEYS = frozenset({"model_path", "path", "load", "timeout_s"})
MAX_TIMEOUT_S = 7 * 24 * 3600.0
# Tests set this to make requests and updates take a while ("test_delay_s" in the body) and to make one TP rank
# fail ("test_fail": {"tp_rank": r, "at": "forward" | "collective"}, which no real input reaches); never in
# production.
TEST_HOOKS_ENV = "SLIMECLI_TEACHER_TEST_HOOKS"
TEST_FAULTS = ("forward", "collective")


def _hooks() -> bool:
    return os.environ.get(TEST_HOOKS_ENV) == "1"


def _check_keys(body: dict[str, Any], allowed: frozenset[str],
                test_keys: tuple[str, ...] = ("test_delay_s",)) -> None:
    """Unknown top-level fields are a 400 naming them (as on the engine): nothing is silently ignored."""
    unknown = sorted(k for k in body if k not in allowed and not (k in test_keys and _hooks()))
    if unknown:
        names = ", ".join(repr(k[:60]) for k in unknown[:10])
        raise RequestError(400, f"unsupported field(s) {names}; known: {', '.join(sorted(allowed))}")


def injected_delay(body: dict[str, Any]) -> float:
    """The test hook's delay in seconds (0 unless TEST_HOOKS_ENV is set)."""
    if not _hooks():
        return 0.0
    value = finite(body.get("test_delay_s", 0.0))
    return value if value is not None and value > 0 else 0.0


def injected_fault(body: dict[str, Any]) -> tuple[int, str] | None:
    """The test hook's (tp_rank, stage) at which one rank raises, or None."""
    value = body.get("test_fail") if _hooks() else None
    if value is None:
        return None
    if not (isinstance(value, dict) and is_int(value.get("tp_rank")) and value.get("at") in TEST_FAULTS):
        raise RequestError(400, f'test_fail must be {{"tp_rank": int, "at": one of {TEST_FAULTS}}}')
    return value["tp_rank"], value["at"]


class RequestError(Exception):
    """A request the server refuses: HTTP status and JSON body."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": message, **extra}


@dataclass(frozen=True)
class GenerateRequest:
    input_ids: list[int]
    sample_n: int
    labels: list[list[int]] | None
    temperature: float
    delay_s: float = 0.0
    fault: tuple[int, str] | None = None  # test hook (TEST_HOOKS_ENV)

    @property
    def tokens(self) -> int:
        return len(self.input_ids)


@dataclass(frozen=True)
class GenerateBody:
    """/generate's JSON body: THUDM/slime's teacher API, plus `temperature` (the server's when unset)."""

    input_ids: list[int] = spec(ge=0, lt=VOCAB, note=VOCAB_NOTE)
    sample_n: int = spec(0, ge=0, le=MAX_SAMPLE_N)
    label_token_ids: list[list[int]] | None = spec(None, ge=0, lt=VOCAB, note=VOCAB_NOTE)
    temperature: float | None = spec(None, ge=TEMPERATURE_RANGE[0], le=TEMPERATURE_RANGE[1])
    timeout_s: float | None = spec(None, gt=0, le=MAX_TIMEOUT_S)


@dataclass(frozen=True)
class UpdateBody:
    """/update_weights_from_disk's JSON body; `path` and `load` are aliases of model_path."""

    model_path: str | None = spec(None, nonempty=True)
    path: str | None = spec(None, nonempty=True)
    load: str | None = spec(None, nonempty=True)
    timeout_s: float | None = spec(None, gt=0, le=MAX_TIMEOUT_S)


def _decoded(cls: type[T], body: dict[str, Any], vocab_size: int = 0) -> T:
    errors: list[FieldError] = []
    hooks = ("test_delay_s", "test_fail")
    out = decode(cls, {k: v for k, v in body.items() if k not in hooks}, "", errors, request(vocab_size=vocab_size))
    if errors or out is None:
        raise RequestError(400, message(errors))
    return out


def _default(cls: type[T], key: str, value: float) -> float:
    """The server's own value for an unset field, checked as a request's would be (a bad setting is a 400)."""
    errors: list[FieldError] = []
    decode_value(value, float, key, errors, field_specs(cls)[key], REQUEST)
    if errors:
        raise RequestError(400, message(errors))
    return value


def parse_generate(body: Any, vocab_size: int, max_length: int, default_temperature: float) -> GenerateRequest:
    if not isinstance(body, dict):
        raise RequestError(400, "the body must be a JSON object")
    _check_keys(body, GENERATE_KEYS, ("test_delay_s", "test_fail"))
    ids = body.get("input_ids")
    if ids is None:
        raise RequestError(400, "input_ids is required")
    if not isinstance(ids, list) or not ids:
        raise RequestError(400, "input_ids must be a non-empty list of token ids")
    if len(ids) < 2:  # the log-probs are of each next token: one token has none (the ranks would refuse it)
        raise RequestError(400, "input_ids needs at least 2 tokens (a log-prob for each token after the first)")
    if max_length and len(ids) > max_length:
        raise RequestError(413, f"input of {len(ids)} tokens is longer than max_length={max_length}",
                           input_length=len(ids), max_length=max_length)
    req = _decoded(GenerateBody, body, vocab_size)
    positions = len(ids) - 1
    if req.sample_n * positions > MAX_SAMPLED:
        raise RequestError(400, f"sample_n: {req.sample_n} samples at each of {positions} positions is more than "
                                f"{MAX_SAMPLED} sampled ids in one reply; send shorter or fewer")
    labels = req.label_token_ids
    if labels is not None:
        if len(labels) != positions:
            raise RequestError(400, f"label_token_ids must be a list of len(input_ids)-1 = {positions} rows")
        width = len(labels[0]) if labels else 0
        if width > MAX_LABEL_WIDTH:
            raise RequestError(400, f"label_token_ids rows have {width} ids, at most {MAX_LABEL_WIDTH}")
        for r, row in enumerate(labels):
            if len(row) != width:
                raise RequestError(400, f"label_token_ids rows must have equal width: row 0 has {width}, "
                                        f"row {r} has {len(row)}")
    temperature = _default(GenerateBody, "temperature", default_temperature) if req.temperature is None \
        else req.temperature
    return GenerateRequest(req.input_ids, req.sample_n, labels, temperature, injected_delay(body),
                           injected_fault(body))


def parse_update(body: Any, default_timeout_s: float) -> tuple[str, float, float]:
    """(model_path, timeout_s, test delay); `path` and `load` are accepted as aliases of model_path."""
    if not isinstance(body, dict):
        raise RequestError(400, "the body must be a JSON object")
    _check_keys(body, UPDATE_KEYS)
    req = _decoded(UpdateBody, body)
    path = req.model_path or req.path or req.load
    if path is None:
        raise RequestError(400, "model_path (a checkpoint directory) is required")
    timeout = _default(UpdateBody, "timeout_s", default_timeout_s) if req.timeout_s is None else req.timeout_s
    return path, timeout, injected_delay(body)
