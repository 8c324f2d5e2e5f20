"""From scored samples to a dataset's metrics and per-sample rows."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slimecli.eval.passk import mean_pass_at_k, powers_of_two
from slimecli.reward.stats import JUDGE_KEY, judge_metrics
from slimecli.rollout.sample import Sample


@dataclass
class Outcome:
    """One attempt at one prompt: a single-turn sample, or an agent run (all the samples it forked into)."""

    prompt_index: int
    sample_index: int
    record: dict[str, Any]
    samples: list[Sample]
    value: float | None  # the reward's training value; None: invalid
    invalid: str | None = None  # why there is no value (a failed reward, an aborted agent run)

    def passed(self, threshold: float) -> bool:
        return self.value is not None and self.value >= threshold

    @property
    def response_length(self) -> int:
        return sum(s.response_length for s in self.samples)

    @property
    def grade(self) -> Mapping[str, Any] | None:
        reward = self.samples[0].reward if self.samples else None
        return reward if isinstance(reward, Mapping) else None


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def dataset_metrics(outcomes: list[Outcome], n: int, threshold: float, swe: bool = False) -> dict[str, float]:
    """reward_mean (over valid attempts), pass@k for every power of two k <= n, response_len_mean, invalid
    (the fraction of attempts without a value); judge_errors and the judge's other counts where a judge graded;
    for SWE tasks also resolved_rate (over graded runs)."""
    valid = [o for o in outcomes if o.value is not None]
    out: dict[str, float] = {
        "reward_mean": _mean([float(o.value) for o in valid if o.value is not None]),
        "response_len_mean": _mean([float(o.response_length) for o in outcomes]),
        "invalid": (len(outcomes) - len(valid)) / len(outcomes) if outcomes else 0.0,
        "samples": float(len(outcomes)),
        "prompts": float(len({o.prompt_index for o in outcomes})),
    }
    counts: dict[int, list[int]] = {}
    for o in valid:
        entry = counts.setdefault(o.prompt_index, [0, 0])
        entry[0] += 1
        entry[1] += int(o.passed(threshold))
    for k in powers_of_two(n):
        value = mean_pass_at_k([(a, b) for a, b in counts.values()], k)
        if value is not None:
            out[f"pass@{k}"] = value
    out.update({k.split("/", 1)[1]: v for k, v in judge_metrics(s for o in outcomes for s in o.samples).items()})  # judge_*
    if swe:
        graded = [o.grade for o in valid if o.grade is not None]
        out["resolved_rate"] = _mean([float(bool(g.get("resolved"))) for g in graded])
    return out


def episode_summary(outcomes: list[Outcome], label: str) -> dict[str, float]:
    """An environment dataset's episodes as the training rollout reports them (env/<source>/...): mean turns,
    tool calls and parse errors, the turn-limit rate, the dropped episodes by reason."""
    from slimecli.env.rollout import episode_metrics

    prefix = f"env/{label}/"
    keep = ("turns", "tool_calls/", "tool_errors", "turn_limit_rate", "dropped")
    metrics = episode_metrics([s for o in outcomes for s in o.samples])
    return {k[len(prefix):]: v for k, v in metrics.items() if k.startswith(prefix) and k[len(prefix):].startswith(keep)}


def sample_row(o: Outcome, threshold: float) -> dict[str, Any]:
    """The per-sample line of RUN/eval/step_<N>/<name>.jsonl."""
    from slimecli.observe.metrics import to_json_value

    first = o.samples[0] if o.samples else Sample()
    row: dict[str, Any] = {
        "prompt_index": o.prompt_index, "sample_index": o.sample_index, "prompt": o.record.get("prompt"),
        "label": o.record.get("label"), "response": first.response, "reward": first.reward, "value": o.value,
        "passed": o.passed(threshold), "invalid": o.invalid, "response_length": o.response_length,
        "status": getattr(first.status, "value", str(first.status)),
    }
    if "task" in o.record and "source" in o.record:  # an environment episode: its task row, turns, why dropped
        row.update(task=o.record["task"], turns=first.metadata.get("turns"),
                   drop_reason=first.metadata.get("drop_reason"))
    if "instance_id" in (o.record.get("metadata") or {}):
        row["instance_id"] = o.record["metadata"]["instance_id"]
    if isinstance(first.metadata.get(JUDGE_KEY), Mapping):  # reward=judge: its verdict, or why there is none
        row["judge"] = dict(first.metadata[JUDGE_KEY])
    return dict(to_json_value(row))
