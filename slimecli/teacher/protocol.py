"""Validation of teacher-server request bodies: every malformed field is a 4xx with a message, never a 500.

The reference server let ids outside the vocabulary reach the model (wrong results or a crash on a
TP rank, which hangs its peers); here nothing reaches a worker before it has been checked.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

MAX_SAMPLE_N = 4096
MAX_SAMPLED = 1 << 24  # (len(input_ids) - 1) x sample_n: sampled ids one reply may carry
MAX_LABEL_WIDTH = 256  # label_token_ids per position
# Where log-softmax(logits / T) stays finite in every dtype a teacher runs in (fp16 included); the issue
# that a 1e-40 temperature showed: logits / T overflow to inf, and the log-probs turn to NaN.
TEMPERATURE_RANGE = (1e-2, 1e2)
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


def _finite(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _show(v: Any) -> str:
    text = repr(v) if not isinstance(v, int) or abs(v) < 10 ** 30 else f"an integer of {len(str(abs(v)))} digits"
    return text if len(text) <= 80 else text[:77] + "..."


def test_delay(body: dict[str, Any]) -> float:
    if not _hooks():
        return 0.0
    value = body.get("test_delay_s", 0.0)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else 0.0


def test_fault(body: dict[str, Any]) -> tuple[int, str] | None:
    """The test hook's (tp_rank, stage) at which one rank raises, or None."""
    value = body.get("test_fail") if _hooks() else None
    if value is None:
        return None
    if not (isinstance(value, dict) and _is_int(value.get("tp_rank")) and value.get("at") in TEST_FAULTS):
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


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_ids(values: list[Any], vocab_size: int, what: str) -> None:
    for i, v in enumerate(values):
        if not _is_int(v):
            raise RequestError(400, f"{what}[{i}] must be an integer token id, got {_show(v)}")
        if not 0 <= v < vocab_size:
            raise RequestError(400, f"{what}[{i}] = {v} is outside the vocabulary [0, {vocab_size})")


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
    _check_ids(ids, vocab_size, "input_ids")

    sample_n = body.get("sample_n", 0)
    if sample_n is None:
        sample_n = 0
    if not _is_int(sample_n) or not 0 <= sample_n <= MAX_SAMPLE_N:
        raise RequestError(400, f"sample_n must be an integer in [0, {MAX_SAMPLE_N}], got {_show(sample_n)}")
    if sample_n * (len(ids) - 1) > MAX_SAMPLED:
        raise RequestError(400, f"sample_n: {sample_n} samples at each of {len(ids) - 1} positions is more than "
                                f"{MAX_SAMPLED} sampled ids in one reply; send shorter or fewer")

    labels = body.get("label_token_ids")
    if labels is not None:
        if not isinstance(labels, list) or len(labels) != len(ids) - 1:
            raise RequestError(400, f"label_token_ids must be a list of len(input_ids)-1 = {len(ids) - 1} rows")
        width = None
        for r, row in enumerate(labels):
            if not isinstance(row, list):
                raise RequestError(400, f"label_token_ids[{r}] must be a list of token ids")
            if width is None:
                width = len(row)
                if width > MAX_LABEL_WIDTH:
                    raise RequestError(400, f"label_token_ids rows have {width} ids, at most {MAX_LABEL_WIDTH}")
            elif len(row) != width:
                raise RequestError(400, f"label_token_ids rows must have equal width: row 0 has {width}, "
                                        f"row {r} has {len(row)}")
            _check_ids(row, vocab_size, f"label_token_ids[{r}]")

    raw_timeout = body.get("timeout_s")
    if raw_timeout is not None and not 0 < (_finite(raw_timeout) or 0) <= MAX_TIMEOUT_S:
        raise RequestError(400, f"timeout_s must be a number in (0, {MAX_TIMEOUT_S:g}], got {_show(raw_timeout)}")

    raw_t = body.get("temperature", default_temperature)  # an extension: THUDM/slime's teacher API has no field
    temperature = _finite(default_temperature if raw_t is None else raw_t)
    lo, hi = TEMPERATURE_RANGE
    if temperature is None or not lo <= temperature <= hi:
        raise RequestError(400, f"temperature must be a number in [{lo:g}, {hi:g}], got {_show(raw_t)}")
    return GenerateRequest(list(ids), sample_n, labels, temperature, test_delay(body), test_fault(body))


def parse_update(body: Any, default_timeout_s: float) -> tuple[str, float, float]:
    """(model_path, timeout_s, test delay); `path` and `load` are accepted as aliases of model_path."""
    if not isinstance(body, dict):
        raise RequestError(400, "the body must be a JSON object")
    _check_keys(body, UPDATE_KEYS)
    path = next((body[k] for k in ("model_path", "path", "load") if body.get(k) is not None), None)
    if not isinstance(path, str) or not path:
        raise RequestError(400, "model_path (a checkpoint directory) is required")
    raw = body.get("timeout_s", default_timeout_s)
    timeout = _finite(raw)
    if timeout is None or not 0 < timeout <= MAX_TIMEOUT_S:
        raise RequestError(400, f"timeout_s must be a number in (0, {MAX_TIMEOUT_S:g}], got {_show(raw)}")
    return path, timeout, test_delay(body)
