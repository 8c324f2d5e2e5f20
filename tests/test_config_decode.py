"""The one decoder: config groups and request bodies are checked by the same code, with the same messages."""

from __future__ import annotations

import dataclasses
from typing import Literal

import pytest

from slimecli.config.decode import (
    CONFIG,
    REQUEST,
    Spec,
    bounds_text,
    decode,
    decode_value,
    finite,
    is_int,
    message,
    request,
    spec,
)
from slimecli.config.errors import FieldError


@dataclasses.dataclass(frozen=True)
class Body:
    ids: list[int] = spec(ge=0, lt="vocab_size", note="token ids")
    top_k: int = spec(-1, ge=1, also=(-1,), note="-1: all")
    top_p: float = spec(1.0, gt=0, le=1)
    stop: tuple[str, ...] = spec((), one_or_many=True, nonempty=True)
    seed: int | None = spec(None, ge=-(2**63), le=2**64 - 1)
    kind: Literal["a", "b"] = "a"


def lines(cls: type, data: dict, mode=CONFIG) -> list[str]:
    errors: list[FieldError] = []
    decode(cls, data, "x", errors, mode)
    return [e.render() for e in errors]


def test_every_problem_is_named_with_its_bound():
    got = lines(Body, {"ids": [1, 9, True], "top_k": 0, "top_p": 0, "stop": [""], "kind": "c", "nope": 1},
                request(vocab_size=5))
    assert got == ["x.ids[1]: must be in [0, 5) (token ids) (got 9)",
                   "x.ids[2]: expected int (got True)",
                   "x.top_k: must be -1 or >= 1 (-1: all) (got 0)",
                   "x.top_p: must be in (0, 1] (got 0.0)",
                   "x.stop[0]: must not be empty (got '')",
                   "x.kind: not an allowed value (got 'c')\n    hint: allowed: a, b",
                   "x.nope: unknown key (got 1)"]


def test_a_request_reads_null_as_unset_and_a_config_refuses_it():
    errors: list[FieldError] = []
    body = decode(Body, {"ids": [1], "top_p": None, "stop": "end"}, "", errors, request(vocab_size=5))
    assert errors == [] and body == Body(ids=[1], stop=("end",))
    assert lines(Body, {"ids": [], "top_p": None}) == ["x.top_p: expected float (got None)"]
    assert lines(Body, {}) == ["x.ids: is required"]


def test_ints_fit_64_bits_in_a_config_unless_both_bounds_say_more():
    big = 10**30
    assert lines(Body, {"ids": [], "top_k": big}) == [
        f"x.top_k: integer out of range (it must fit in 64 bits) (got {big})"]
    assert lines(Body, {"ids": [], "top_k": big}, REQUEST) == []  # a request clips what it must itself
    assert lines(Body, {"ids": [], "seed": 2**64 - 1}) == []
    assert lines(Body, {"ids": [], "seed": 2**64}) == [
        "x.seed: must be in [-9223372036854775808, 18446744073709551615] (got 18446744073709551616)"]


def test_floats_refuse_nan_inf_and_overflow_unless_the_spec_allows_inf():
    errors: list[FieldError] = []
    for value in (float("nan"), float("inf"), 10**400):
        decode_value(value, float, "t", errors)
    assert [e.reason for e in errors] == ["expected a number, not NaN", "must be a finite number",
                                          "number out of range"]
    errors.clear()
    assert decode_value(float("inf"), float, "t", errors, Spec(non_finite=True)) == float("inf") and not errors


def test_a_long_token_list_takes_the_fast_path_and_a_bad_one_is_found():
    ids = list(range(20_000))
    errors: list[FieldError] = []
    out = decode_value(ids, list[int], "input_ids", errors, Spec(ge=0, lt="v"), request(v=20_000))
    assert out == ids and out is not ids and not errors
    decode_value([*ids, 20_000], list[int], "input_ids", errors, Spec(ge=0, lt="v"), request(v=20_000))
    assert message(errors) == "input_ids[20000]: must be in [0, 20000) (got 20000)"


@pytest.mark.parametrize("fs, words", [(Spec(ge=0, note="0 = no limit"), ">= 0 (0 = no limit)"),
                                       (Spec(gt=0), "> 0"), (Spec(le=2.5), "<= 2.5"), (Spec(ge=1e-6, le=2), "in [1e-06, 2]")])
def test_bounds_read_as_words(fs: Spec, words: str):
    assert bounds_text(fs) == words


def test_the_shared_number_checks():
    assert [is_int(v) for v in (1, True, 1.0, 10**400)] == [True, False, False, True]
    assert [finite(v) for v in (1, 2.5, True, "1", None, [1], float("nan"), float("inf"), 10**400)] == [
        1.0, 2.5, None, None, None, None, None, None, None]


def test_what_a_resume_may_change_comes_from_the_field_specs():
    from slimecli.config.convert import is_resumable
    from slimecli.config.schema import SlimeConfig

    may = ["trainer.max_steps", "trainer.weight_sync", "rollout.port", "agent.host", "teacher.request_timeout_s",
           "run.resume", "observe.wandb", "eval.datasets", "cluster.nnodes"]
    may_not = ["trainer.global_batch_size", "optimizer.lr", "model.path", "teacher.tp", "run.seed", "no.such"]
    assert [k for k in may if not is_resumable(SlimeConfig, k)] == []
    assert [k for k in may_not if is_resumable(SlimeConfig, k)] == []


def test_teacher_limits_and_dtype_are_checked_by_the_schema_as_the_model_dtype_is():
    from slimecli.config.convert import build
    from slimecli.config.groups.teacher import TeacherConfig

    errors: list[FieldError] = []
    build(TeacherConfig, {"tp": 0, "max_length": -1, "dtype": "fp8", "max_retries": -1}, "teacher", errors)
    assert [e.render() for e in errors] == [
        "teacher.tp: must be > 0 (got 0)", "teacher.max_length: must be >= 0 (0 = no limit) (got -1)",
        "teacher.dtype: not an allowed value (got 'fp8')\n    hint: allowed: float32, bfloat16, float16",
        "teacher.max_retries: must be >= 0 (got -1)"]
