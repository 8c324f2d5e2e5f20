"""Raw rewards into training values, the invalid-reward policy, and monitoring that never raises."""

from __future__ import annotations

import decimal
import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slimecli.reward.stats import RewardMeter, reward_metrics, value_metrics
from slimecli.reward.values import (
    REASONS,
    Invalid,
    InvalidRewardError,
    apply_invalid_policy,
    reward_value,
)
from slimecli.rollout.sample import Sample


class BrokenRepr:
    def __repr__(self):
        raise RuntimeError("no repr")


class ItemRaises:
    def item(self):
        raise RuntimeError("boom")


class ItemReturns:
    def __init__(self, value):
        self.value = value

    def item(self):
        return self.value


class BadKeys(dict):
    def __contains__(self, key):
        raise RuntimeError("cannot look up")


@pytest.mark.parametrize("value,key,expected", [
    (1.5, None, 1.5), (2, None, 2.0), (True, None, 1.0), (False, None, 0.0), (Fraction(1, 4), None, 0.25),
    (decimal.Decimal("0.5"), None, 0.5), (np.float32(0.5), None, 0.5), (np.int64(3), None, 3.0),
    (np.bool_(True), None, 1.0), (np.array(0.25), None, 0.25), (np.array([7.0]), None, 7.0),
    ({"score": 1.0, "acc": True, "pred": "42"}, "score", 1.0), ({"acc": True}, "acc", 1.0),
    ({"a": {"b": 0.5}}, "a.b", 0.5), (ItemReturns(0.75), None, 0.75),
])
def test_valid_rewards_become_floats(value, key, expected):
    out = reward_value(value, key)
    assert isinstance(out, float) and out == expected


@pytest.mark.parametrize("value,key,reason,detail", [
    (None, None, "none", "None"), (float("nan"), None, "nan", "NaN"), (float("inf"), None, "inf", "inf"),
    (-math.inf, None, "inf", "-inf"), (10**400, None, "inf", "overflows"), ("1.0", None, "string", "'1.0'"),
    (b"1", None, "bytes", "bytes"), ([1.0], None, "list", "list of 1"), ((1, 2), None, "list", "tuple"),
    ({1.0}, None, "list", "set"), ({"score": 1.0}, None, "dict_without_key", "'score'"),
    ({"acc": True, "pred": "42"}, "score", "missing_key", "keys present: ['acc', 'pred']"),
    ({"score": "high"}, "score", "string", "'high'"), ({"score": None}, "score", "none", ""),
    ({"score": {"x": 1}}, "score", "not_scalar", "dict"), (np.array([1.0, 2.0]), None, "not_scalar", "ndarray"),
    (np.float64("nan"), None, "nan", ""), (ItemRaises(), None, "not_scalar", "ItemRaises"),
    (ItemReturns("x"), None, "string", ""), (BrokenRepr(), None, "unsupported_type", "BrokenRepr"),
    (complex(1, 2), None, "unsupported_type", "complex"), (BadKeys(score=1.0), "score", "unsupported_type", ""),
    (decimal.Decimal("sNaN"), None, "unsupported_type", ""), (object(), None, "unsupported_type", "object"),
])
def test_invalid_rewards_are_explicit(value, key, reason, detail):
    out = reward_value(value, key)
    assert isinstance(out, Invalid), out
    assert out.reason == reason and out.reason in REASONS
    assert detail in out.detail


def test_torch_scalars_duck_typed():
    torch = pytest.importorskip("torch")
    assert reward_value(torch.tensor(0.5)) == 0.5
    assert reward_value(torch.tensor([2], dtype=torch.int64)) == 2.0
    assert reward_value(torch.tensor(True)) == 1.0
    assert reward_value(torch.tensor(float("nan"))).reason == "nan"
    assert reward_value(torch.tensor([1.0, 2.0])).reason == "not_scalar"
    assert reward_value({"score": torch.tensor(0.25)}, "score") == 0.25


def _samples(rewards: list[Any], group_size: int = 2) -> list[Sample]:
    return [Sample(index=i, group_index=i // group_size, reward=r) for i, r in enumerate(rewards)]


def test_on_invalid_policies():
    samples = _samples([1.0, "junk", 0.5, 0.0, None, True])
    samples[3].metadata["reward_error"] = "ValueError"
    zero = apply_invalid_policy(samples, on_invalid="zero")
    assert zero.rewards == [1.0, 0.0, 0.5, 0.0, 0.0, 1.0]
    assert {pos: inv.reason for pos, inv in zero.invalid.items()} == {1: "string", 3: "reward_error", 4: "none"}
    assert zero.invalid_counts() == {"string": 1, "reward_error": 1, "none": 1}
    assert zero.dropped == [] and zero.dropped_groups == []

    drop = apply_invalid_policy(samples, on_invalid="drop_group")
    assert drop.dropped_groups == [0, 1, 2] and drop.dropped == [0, 1, 2, 3, 4, 5]
    fine = _samples([1.0, 0.0, {"s": 1}, {"s": 0.5}])
    drop = apply_invalid_policy(fine, key="t", on_invalid="drop_group")
    assert drop.dropped_groups == [1] and drop.dropped == [2, 3] and drop.rewards == [1.0, 0.0, 0.0, 0.0]
    assert apply_invalid_policy(fine, key="s", on_invalid="drop_group").rewards == [1.0, 0.0, 1.0, 0.5]

    with pytest.raises(InvalidRewardError, match=r"sample index 1 \(group 0\): string: .*'junk'.*2 more invalid"):
        apply_invalid_policy(samples, on_invalid="error")
    assert apply_invalid_policy(_samples([1.0, 0.5]), on_invalid="error").rewards == [1.0, 0.5]
    with pytest.raises(ValueError, match="on_invalid"):
        apply_invalid_policy(samples, on_invalid="ignore")


def test_metrics_on_a_mixed_batch():
    rewards = [{"score": 1.0, "acc": True, "pred": "42"}, {"score": 0.0, "acc": False, "pred": None},
               {"score": 1.0, "acc": True, "pred": "7"}, {"score": 1.0, "acc": 1, "extra": float("nan")},
               {"acc": True}, "text"]
    samples = _samples(rewards)
    m = reward_metrics(samples, key="score", filter_drops={"zero_std": 3, "too_long": 1, "bad": "x"})
    assert m["reward/count"] == 6 and m["reward/valid"] == 4 and m["reward/invalid"] == 2
    assert m["reward/invalid/missing_key"] == 1 and m["reward/invalid/string"] == 1
    assert m["reward/mean"] == 0.75 and m["reward/min"] == 0.0 and m["reward/max"] == 1.0
    assert m["reward/std"] == pytest.approx(math.sqrt(0.1875))
    assert m["reward/key/score/mean"] == 0.75 and m["reward/key/acc/mean"] == 0.8
    assert not any("pred" in k or "extra" in k for k in m)
    assert m["reward/groups"] == 3 and m["reward/zero_std_groups"] == 1  # group 1 = (1.0, 1.0); group 2 none valid
    assert m["filter/drop/zero_std"] == 3 and m["filter/drop_total"] == 4 and "filter/drop/bad" not in m
    assert all(isinstance(v, float) and math.isfinite(v) for v in m.values())


def test_meter_shows_running_mean_and_invalid_count():
    meter = RewardMeter(key="score")
    assert meter.postfix() == "" and meter.mean is None
    meter.update(_samples([{"score": 1.0}, {"score": 0.0}]))
    assert meter.postfix() == "reward 0.5"
    meter.update(_samples([{"score": "x"}, {"acc": 1}, {"score": 1.0}, {"score": 1.0}]))
    assert meter.mean == 0.75 and meter.invalid == 2
    assert meter.postfix() == "reward 0.75 (2 invalid)"
    meter.reset()
    meter.add([None, "x"])
    assert meter.postfix() == "reward n/a (2 invalid)"
    meter.reset()
    meter.add([1.7e308, 1.7e308, -1.7e308])
    assert meter.mean == pytest.approx(1.7e308 / 3)


# --- property tests: arbitrary nested values never break normalisation or statistics -------------------

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5), st.binary(max_size=4),
    st.fractions(), st.decimals(allow_nan=True, allow_infinity=True), st.complex_numbers(),
    st.builds(np.float64, st.floats()), st.builds(np.float32, st.floats(width=32)),
    st.builds(np.int64, st.integers(-(2**63), 2**63 - 1)), st.builds(np.bool_, st.booleans()),
    st.builds(np.array, st.floats()), st.builds(lambda xs: np.array(xs), st.lists(st.floats(), max_size=3)),
    st.builds(ItemReturns, st.one_of(st.floats(), st.text(max_size=2), st.none())),
    st.builds(ItemRaises), st.builds(BrokenRepr), st.builds(object),
)
keys = st.one_of(st.sampled_from(["score", "acc", "pred"]), st.text(max_size=3), st.integers(), st.none())
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.tuples(inner, inner), st.dictionaries(keys, inner, max_size=4)), max_leaves=12)


def oracle_valid(value: Any, key: str | None) -> bool:
    """An independent statement of which rewards are usable."""
    if isinstance(value, dict):
        if key is None or key not in value or isinstance(value[key], dict):
            return False
        value = value[key]
    if isinstance(value, (np.ndarray, np.generic, ItemReturns)):
        try:
            value = value.item()
        except ValueError:
            return False
    if isinstance(value, bool):
        return True
    if isinstance(value, (int, float, Fraction, decimal.Decimal)):
        try:
            return math.isfinite(float(value))
        except (OverflowError, ValueError):
            return False
    return False


@settings(max_examples=300, deadline=None)
@given(value=values, key=st.sampled_from([None, "score", "acc"]))
def test_normaliser_never_raises_and_agrees_with_oracle(value, key):
    out = reward_value(value, key)
    if oracle_valid(value, key):
        assert isinstance(out, float) and math.isfinite(out)
    else:
        assert isinstance(out, Invalid) and out.reason in REASONS and str(out)


@settings(max_examples=150, deadline=None)
@given(rewards=st.lists(values, max_size=10), key=st.sampled_from([None, "score"]),
       group_size=st.integers(1, 4), drops=st.dictionaries(st.text(max_size=4), values, max_size=3))
def test_statistics_never_raise_and_count_correctly(rewards, key, group_size, drops):
    samples = _samples(rewards, group_size)
    m = reward_metrics(samples, key=key, filter_drops=drops)
    assert "reward/metrics_error" not in m
    assert all(isinstance(v, float) and math.isfinite(v) for v in m.values())
    expected_valid = [reward_value(r, key) for r in rewards if oracle_valid(r, key)]
    assert m["reward/count"] == len(rewards)
    assert m["reward/valid"] == len(expected_valid)
    assert m["reward/invalid"] == len(rewards) - len(expected_valid)
    assert sum(v for k, v in m.items() if k.startswith("reward/invalid/")) == m["reward/invalid"]
    if expected_valid:
        assert m["reward/min"] == min(expected_valid) and m["reward/max"] == max(expected_valid)
        tol = 1e-9 * max(abs(v) for v in expected_valid)
        assert m["reward/min"] - tol <= m["reward/mean"] <= m["reward/max"] + tol
    else:
        assert "reward/mean" not in m
    assert m["reward/zero_std_groups"] <= m["reward/groups"] == len({s.group_index for s in samples})

    policy = apply_invalid_policy(samples, key=key, on_invalid="drop_group")
    assert len(policy.rewards) == len(rewards) and all(math.isfinite(r) for r in policy.rewards)
    assert len(policy.invalid) == m["reward/invalid"]
    bad_groups = {samples[pos].group_index for pos in policy.invalid}
    assert set(policy.dropped_groups) == bad_groups
    assert policy.dropped == [i for i, s in enumerate(samples) if s.group_index in bad_groups]

    meter = RewardMeter(key=key)
    meter.update(samples)
    meter.add(rewards)
    assert meter.valid == 2 * len(expected_valid) and meter.invalid == 2 * int(m["reward/invalid"])
    assert isinstance(meter.postfix(), str)
    assert value_metrics(rewards, key)["reward/valid"] == len(expected_valid)
