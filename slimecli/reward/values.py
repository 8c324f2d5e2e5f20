"""Turn whatever a reward function returned into a training value, or an explicit invalid marker.

Reward functions are user code: they return floats, ints, bools, numpy/torch scalars, dicts,
None, NaN, strings, lists. Training needs one finite float per sample, so every value goes
through `reward_value`, which never raises; `apply_invalid_policy` then decides what an
invalid reward does to the batch (reward.on_invalid = zero | drop_group | error).
"""

from __future__ import annotations

import decimal
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Stable reasons: metrics count invalid rewards by these names.
REASONS = ("none", "nan", "inf", "string", "bytes", "list", "dict_without_key", "missing_key", "not_scalar",
           "unsupported_type", "reward_error")


@dataclass(frozen=True)
class Invalid:
    """An unusable reward: `reason` is one of REASONS (metrics key), `detail` is for humans."""

    reason: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}" if self.detail else self.reason


def safe_repr(value: Any, limit: int = 80) -> str:
    """repr() that neither raises nor floods the log."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - user objects may have a broken __repr__: the text says so
        text = f"<{type(value).__name__} with a broken repr>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _from_number(value: float) -> float | Invalid:
    if math.isnan(value):
        return Invalid("nan", "reward is NaN")
    if math.isinf(value):
        return Invalid("inf", f"reward is {value}")
    return value


def _scalar(value: Any) -> float | Invalid:
    """A single non-container value; dicts are handled by the caller."""
    if value is None:
        return Invalid("none", "reward is None")
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (numbers.Real, decimal.Decimal)):  # int, float, Fraction, Decimal, numpy float64 ...
        try:
            return _from_number(float(value))
        except OverflowError:
            return Invalid("inf", f"reward {safe_repr(value, 40)} overflows a float")
        except (TypeError, ValueError) as exc:
            return Invalid("unsupported_type", f"{type(value).__name__} not convertible: {exc}")
    if isinstance(value, str):
        return Invalid("string", f"reward is a string {safe_repr(value)}")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return Invalid("bytes", f"reward is {type(value).__name__}")
    item = getattr(value, "item", None)
    if callable(item):  # numpy / torch scalars and one-element arrays or tensors, without importing torch
        try:
            inner = item()
        except Exception as exc:  # noqa: BLE001 - e.g. a tensor with several elements: an Invalid that says so
            return Invalid("not_scalar", f"{type(value).__name__}.item() failed: {type(exc).__name__}")
        if inner is value or hasattr(inner, "item") and not isinstance(inner, (numbers.Number, bool)):
            return Invalid("unsupported_type", f"{type(value).__name__}.item() returned {type(inner).__name__}")
        return _scalar(inner)
    if isinstance(value, (Sequence, set, frozenset)):
        return Invalid("list", f"reward is a {type(value).__name__} of {_safe_len(value)} items; return one number")
    return Invalid("unsupported_type", f"reward of type {type(value).__name__}")


def _safe_len(value: Any) -> str:
    try:
        return str(len(value))
    except Exception:  # noqa: BLE001 - a length only for a message: "?" when the object has none
        return "?"


def _lookup(data: Mapping, key: str) -> tuple[bool, Any]:
    """data[key], or data['a']['b'] for key 'a.b' when the dotted key itself is absent."""
    if key in data:
        return True, data[key]
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _keys(data: Mapping, limit: int = 10) -> str:
    keys = [safe_repr(k, 30) for k in list(data)[:limit]]
    more = f", ... ({len(data)} keys)" if len(data) > limit else ""
    return ("[" + ", ".join(keys) + more + "]") if keys else "[] (empty dict)"


def reward_value(value: Any, key: str | None = None) -> float | Invalid:
    """The finite float training value of a reward, or Invalid(reason, detail). Never raises.

    Dicts are read through `key` (reward.key); a missing key names the keys present. bool -> 0/1.
    None, NaN, inf, strings, lists and anything without a single numeric value are Invalid.
    """
    try:
        if isinstance(value, Invalid):
            return value
        if isinstance(value, Mapping):
            if not key:
                return Invalid("dict_without_key", f"dict reward needs reward.key; keys present: {_keys(value)}")
            found, inner = _lookup(value, key)
            if not found:
                return Invalid("missing_key", f"reward.key {key!r} not in the dict reward; keys present: {_keys(value)}")
            if isinstance(inner, Mapping):
                return Invalid("not_scalar", f"reward[{key!r}] is a dict; point reward.key at a number")
            return _scalar(inner)
        return _scalar(value)
    except Exception as exc:  # noqa: BLE001 - the whole point: no reward value can crash training (an Invalid)
        return Invalid("unsupported_type", f"cannot read reward ({type(exc).__name__})")


def sample_reward(sample: Any, key: str | None = None) -> float | Invalid:
    """reward_value for a Sample, honouring a reward_error assign_rewards recorded on it."""
    try:
        metadata = getattr(sample, "metadata", None)
        if isinstance(metadata, Mapping) and metadata.get("reward_error"):
            return Invalid("reward_error", f"reward function failed: {metadata['reward_error']}")
        return reward_value(getattr(sample, "reward", None), key)
    except Exception as exc:  # noqa: BLE001 - no sample can crash training: an Invalid that names the error
        return Invalid("unsupported_type", f"cannot read the sample's reward ({type(exc).__name__})")


class InvalidRewardError(ValueError):
    """reward.on_invalid=error and a reward was invalid."""


@dataclass
class RewardBatch:
    """Training rewards for a batch after the invalid-reward policy.

    rewards: one float per sample (0.0 for invalid or dropped ones).
    invalid: position in the batch -> Invalid.
    dropped: positions whose group was dropped (reward.on_invalid=drop_group); the trainer
             sets remove_sample on them (or leaves them out) so they carry no gradient.
    dropped_groups: the group_index values dropped.
    """

    rewards: list[float]
    invalid: dict[int, Invalid] = field(default_factory=dict)
    dropped: list[int] = field(default_factory=list)
    dropped_groups: list[int] = field(default_factory=list)

    def invalid_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for inv in self.invalid.values():
            counts[inv.reason] = counts.get(inv.reason, 0) + 1
        return counts


ON_INVALID = ("zero", "drop_group", "error")


def apply_invalid_policy(samples: Sequence[Any], key: str | None = None, on_invalid: str = "zero") -> RewardBatch:
    """Training rewards for `samples` (Sample objects); what an invalid reward does depends on on_invalid:

    zero: it trains as 0.0 (the run keeps going, metrics count it);
    drop_group: every sample of its group (same group_index) is listed in `dropped`;
    error: raise InvalidRewardError naming the sample's index and the reason.
    """
    if on_invalid not in ON_INVALID:
        raise ValueError(f"reward.on_invalid must be one of {', '.join(ON_INVALID)}, got {on_invalid!r}")
    batch = RewardBatch(rewards=[])
    for pos, sample in enumerate(samples):
        value = sample_reward(sample, key)
        if isinstance(value, Invalid):
            batch.invalid[pos] = value
            batch.rewards.append(0.0)
        else:
            batch.rewards.append(value)
    if not batch.invalid or on_invalid == "zero":
        return batch
    if on_invalid == "error":
        pos, inv = next(iter(batch.invalid.items()))
        index = getattr(samples[pos], "index", pos)
        more = f" ({len(batch.invalid) - 1} more invalid in this batch)" if len(batch.invalid) > 1 else ""
        raise InvalidRewardError(f"invalid reward for sample index {index} (group "
                                 f"{getattr(samples[pos], 'group_index', '?')}): {inv}{more}; "
                                 "set reward.on_invalid=zero or drop_group to keep training")
    bad_groups = {getattr(samples[pos], "group_index", None) for pos in batch.invalid}
    batch.dropped_groups = sorted(g for g in bad_groups if g is not None)
    batch.dropped = [pos for pos, s in enumerate(samples) if getattr(s, "group_index", None) in bad_groups]
    for pos in batch.dropped:
        batch.rewards[pos] = 0.0
    return batch
