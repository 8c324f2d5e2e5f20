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
# Tests set this to make requests and updates take a while ("test_delay_s" in the body); never in production.
TEST_HOOKS_ENV = "SLIMECLI_TEACHER_TEST_HOOKS"


def test_delay(body: dict[str, Any]) -> float:
    if os.environ.get(TEST_HOOKS_ENV) != "1":
        return 0.0
    value = body.get("test_delay_s", 0.0)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else 0.0


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

    @property
    def tokens(self) -> int:
        return len(self.input_ids)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_ids(values: list[Any], vocab_size: int, what: str) -> None:
    for i, v in enumerate(values):
        if not _is_int(v):
            raise RequestError(400, f"{what}[{i}] must be an integer token id, got {v!r}")
        if not 0 <= v < vocab_size:
            raise RequestError(400, f"{what}[{i}] = {v} is outside the vocabulary [0, {vocab_size})")


def parse_generate(body: Any, vocab_size: int, max_length: int, default_temperature: float) -> GenerateRequest:
    if not isinstance(body, dict):
        raise RequestError(400, "the body must be a JSON object")
    ids = body.get("input_ids")
    if ids is None:
        raise RequestError(400, "input_ids is required")
    if not isinstance(ids, list) or not ids:
        raise RequestError(400, "input_ids must be a non-empty list of token ids")
    if max_length and len(ids) > max_length:
        raise RequestError(413, f"input of {len(ids)} tokens is longer than max_length={max_length}",
                           input_length=len(ids), max_length=max_length)
    _check_ids(ids, vocab_size, "input_ids")

    sample_n = body.get("sample_n", 0)
    if sample_n is None:
        sample_n = 0
    if not _is_int(sample_n) or not 0 <= sample_n <= MAX_SAMPLE_N:
        raise RequestError(400, f"sample_n must be an integer in [0, {MAX_SAMPLE_N}], got {sample_n!r}")

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
            elif len(row) != width:
                raise RequestError(400, f"label_token_ids rows must have equal width: row 0 has {width}, "
                                        f"row {r} has {len(row)}")
            _check_ids(row, vocab_size, f"label_token_ids[{r}]")

    temperature = body.get("temperature", default_temperature)  # an extension: THUDM/slime's teacher API has no field
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not (
            math.isfinite(temperature) and temperature > 0):
        raise RequestError(400, f"temperature must be a number > 0, got {temperature!r}")
    return GenerateRequest(list(ids), sample_n, labels, float(temperature), test_delay(body))


def parse_update(body: Any, default_timeout_s: float) -> tuple[str, float, float]:
    """(model_path, timeout_s, test delay); `path` and `load` are accepted as aliases of model_path."""
    if not isinstance(body, dict):
        raise RequestError(400, "the body must be a JSON object")
    path = next((body[k] for k in ("model_path", "path", "load") if body.get(k) is not None), None)
    if not isinstance(path, str) or not path:
        raise RequestError(400, "model_path (a checkpoint directory) is required")
    timeout = body.get("timeout_s", default_timeout_s)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not (
            math.isfinite(timeout) and timeout > 0):
        raise RequestError(400, f"timeout_s must be a number > 0, got {timeout!r}")
    return path, float(timeout), test_delay(body)
