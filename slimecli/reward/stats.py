"""Reward monitoring that cannot crash: per-step metrics and the progress bar's running mean.

THUDM/slime's rollout progress bar called float() on the first value of a dict reward and
crashed on non-numeric rewards; slimecli reads every value through reward_value, so any
reward (dicts of strings, NaN, None, tensors, nested junk) is either counted as valid or
counted as invalid by reason. Nothing here raises on a reward value.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from slimecli.reward.values import Invalid, reward_value, safe_repr, sample_reward

log = logging.getLogger(__name__)

ZERO_STD_EPS = 1e-6
_MAX_KEY_METRICS = 32  # per-key means of dict rewards: at most this many keys per step


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Population mean and std of finite floats, scaled so that huge values do not overflow."""
    n = len(values)
    scale = max(abs(v) for v in values)
    if scale == 0:
        return 0.0, 0.0
    scaled = [v / scale for v in values]
    mean = math.fsum(scaled) / n
    var = math.fsum((v - mean) ** 2 for v in scaled) / n
    return mean * scale, math.sqrt(var) * scale


def _numeric_field(value: Any) -> float | None:
    """A dict reward's field as a float when it is a finite number (bools count as 0/1), else None."""
    if isinstance(value, (str, bytes, Mapping)) or value is None:
        return None
    if not isinstance(value, (numbers.Number, bool)) and not callable(getattr(value, "item", None)):
        return None
    out = reward_value(value)
    return None if isinstance(out, Invalid) else out


def _key_name(key: Any) -> str:
    text = key if isinstance(key, str) else safe_repr(key, 40)
    return text.replace("/", "_")[:64] or "_"


def _metrics(entries: list[tuple[float | Invalid, Any, Any]], prefix: str) -> dict[str, float]:
    out: dict[str, float] = {}
    valid = [v for v, _, _ in entries if not isinstance(v, Invalid)]
    invalid: dict[str, int] = {}
    for v, _, _ in entries:
        if isinstance(v, Invalid):
            invalid[v.reason] = invalid.get(v.reason, 0) + 1
    out[f"{prefix}/count"] = float(len(entries))
    out[f"{prefix}/valid"] = float(len(valid))
    out[f"{prefix}/invalid"] = float(sum(invalid.values()))
    for reason, n in sorted(invalid.items()):
        out[f"{prefix}/invalid/{reason}"] = float(n)
    if valid:
        mean, std = _mean_std(valid)
        out[f"{prefix}/mean"], out[f"{prefix}/std"] = mean, std
        out[f"{prefix}/min"], out[f"{prefix}/max"] = min(valid), max(valid)

    sums: dict[str, list[float]] = {}
    for _, raw, _ in entries:
        if not isinstance(raw, Mapping):
            continue
        for k, field_value in list(raw.items()):
            number = _numeric_field(field_value)
            if number is None:
                continue
            name = _key_name(k)
            if name not in sums and len(sums) >= _MAX_KEY_METRICS:
                continue
            sums.setdefault(name, []).append(number)
    for name, numbers_ in sums.items():
        out[f"{prefix}/key/{name}/mean"] = _mean_std(numbers_)[0]

    groups: dict[Any, list[float]] = {}
    for v, _, group in entries:
        bucket = groups.setdefault(group, [])
        if not isinstance(v, Invalid):
            bucket.append(v)
    out[f"{prefix}/groups"] = float(len(groups))
    out[f"{prefix}/zero_std_groups"] = float(sum(1 for vs in groups.values() if vs and _mean_std(vs)[1] <= ZERO_STD_EPS))
    return out


JUDGE_KEY = "judge"  # sample.metadata["judge"], written by reward=judge (judge.py)


def judge_metrics(samples: Iterable[Any], prefix: str = "reward") -> dict[str, float]:
    """For samples a judge graded (reward=judge): {prefix}/judge_calls (verdicts asked for), /judge_cached (of
    them, answered from the cache), /judge_errors (no verdict: the judge was down or its reply did not parse)
    and /judge_errors/<kind>. Nothing when no sample was judged."""
    calls = cached = 0
    errors: dict[str, int] = {}
    for s in samples:
        metadata = getattr(s, "metadata", None)
        record = metadata.get(JUDGE_KEY) if isinstance(metadata, Mapping) else None
        if not isinstance(record, Mapping):
            continue
        calls += 1
        cached += bool(record.get("cached"))
        if record.get("error"):
            kind = _key_name(record["error"])
            errors[kind] = errors.get(kind, 0) + 1
    if not calls:
        return {}
    out = {f"{prefix}/judge_calls": float(calls), f"{prefix}/judge_cached": float(cached),
           f"{prefix}/judge_errors": float(sum(errors.values()))}
    out.update({f"{prefix}/judge_errors/{kind}": float(n) for kind, n in sorted(errors.items())})
    return out


def _filter_metrics(filter_drops: Mapping[str, Any] | None) -> dict[str, float]:
    """Dynamic-filter drop counts by reason, as passed in by the rollout loop (non-numbers are skipped)."""
    out: dict[str, float] = {}
    if not isinstance(filter_drops, Mapping):
        return out
    total = 0.0
    for reason, count in list(filter_drops.items()):
        number = _numeric_field(count)
        if number is None:
            continue
        out[f"filter/drop/{_key_name(reason)}"] = number
        total += number
    out["filter/drop_total"] = total
    return out


def reward_metrics(samples: Iterable[Any], key: str | None = None, *, filter_drops: Mapping[str, Any] | None = None,
                   prefix: str = "reward") -> dict[str, float]:
    """Per-step reward metrics of Sample objects (all finite floats, ready for metrics.jsonl).

    {prefix}/mean|std|min|max over valid rewards (absent when none is valid), /count, /valid,
    /invalid, /invalid/<reason>, /key/<k>/mean for numeric fields of dict rewards, /groups,
    /zero_std_groups (groups whose valid rewards all agree: no GRPO signal), and
    filter/drop/<reason> + filter/drop_total from the dynamic filter's counts.
    """
    try:
        samples = list(samples)
        entries = [(sample_reward(s, key), getattr(s, "reward", None), getattr(s, "group_index", None))
                   for s in samples]
        out = _metrics(entries, prefix)
        out.update(judge_metrics(samples, prefix))
    except Exception as exc:  # noqa: BLE001 - a broken Sample-like object: report that, never raise
        log.warning("reward metrics failed: %s: %s", type(exc).__name__, exc)
        out = {f"{prefix}/metrics_error": 1.0}
    try:
        out.update(_filter_metrics(filter_drops))
    except Exception as exc:  # noqa: BLE001 - metrics never stop training: counted and logged
        log.warning("filter metrics failed: %s: %s", type(exc).__name__, exc)
        out["filter/metrics_error"] = 1.0
    return out


def value_metrics(values: Iterable[Any], key: str | None = None, groups: Iterable[Any] | None = None,
                  prefix: str = "reward") -> dict[str, float]:
    """reward_metrics for raw reward values (optionally with their group ids) instead of samples."""
    try:
        values = list(values)
        group_ids = list(groups) if groups is not None else list(range(len(values)))
        if len(group_ids) != len(values):
            group_ids = list(range(len(values)))
        return _metrics([(reward_value(v, key), v, g) for v, g in zip(values, group_ids, strict=True)], prefix)
    except Exception as exc:  # noqa: BLE001 - metrics never stop training: counted and logged
        log.warning("reward metrics failed: %s: %s", type(exc).__name__, exc)
        return {f"{prefix}/metrics_error": 1.0}


class RewardMeter:
    """Running mean of valid rewards for the progress bar, plus the invalid count."""

    def __init__(self, key: str | None = None):
        self.key = key
        self._mean = 0.0  # updated incrementally so that huge rewards cannot overflow a sum
        self.valid = 0
        self.invalid = 0

    def update(self, samples: Iterable[Any]) -> None:
        """Add a batch of Sample objects."""
        try:
            self.add([sample_reward(s, self.key) for s in samples])
        except Exception:  # not a reward value's fault (add() takes any): a bug of ours, kept out of the run
            log.warning("reward running mean skipped a batch", exc_info=True)

    def add(self, values: Iterable[Any]) -> None:
        """Add raw reward values (or training values already converted / Invalid markers)."""
        try:
            for value in values:
                v = reward_value(value, self.key)
                if isinstance(v, Invalid):
                    self.invalid += 1
                else:
                    self.valid += 1
                    self._mean = (self._mean - self._mean / self.valid) + v / self.valid
        except Exception:  # reward_value takes any value; an iterable that fails mid-way ends the batch here
            log.warning("reward running mean stopped inside a batch", exc_info=True)

    @property
    def mean(self) -> float | None:
        if not self.valid:
            return None
        return self._mean if math.isfinite(self._mean) else None

    def postfix(self) -> str:
        """'reward 0.512', 'reward 0.512 (3 invalid)', 'reward n/a (8 invalid)' or '' before any reward."""
        if not self.valid and not self.invalid:
            return ""
        mean = self.mean
        text = "reward n/a" if mean is None else f"reward {mean:.4g}"
        return f"{text} ({self.invalid} invalid)" if self.invalid else text

    def reset(self) -> None:
        self._mean, self.valid, self.invalid = 0.0, 0, 0
