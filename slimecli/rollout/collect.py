"""The one collect loop of every rollout kind: draw prompt records -> run their groups -> rewards -> filters ->
count -> metrics, until rollout.batch_size groups pass.

A rollout kind gives it a group runner: `record, group_index -> runs`, where a run is the samples of one try at
the prompt (one sample for single-turn; an agent run's trajectory branches for the agent kind). The loop decides
which groups train: invalid rewards (reward.on_invalid=drop_group), too few valid runs (`min_valid_runs`: a run
counts when a sample of it is not removed), then rollout.dynamic_filter=zero_std over the rewards of the valid
runs' first branches.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from slimecli.config.schema import SlimeConfig
from slimecli.rollout.data import PromptSource
from slimecli.rollout.sample import Sample, Status

log = logging.getLogger("slimecli.rollout")
MAX_OVERSAMPLING = 20  # give up after this many batches worth of groups fail the filters

Run = list[Sample]  # the samples of one try at a prompt
GroupRunner = Callable[[dict[str, Any], int], Awaitable[list[Run]]]


@dataclass
class RolloutResult:
    samples: list[Sample]  # batch_size groups x n_samples_per_prompt, sorted by index
    train_rewards: list[float]  # one training value per sample (invalid rewards already resolved)
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Filters:
    """What a rollout kind adds to the loop's defaults."""

    min_valid_runs: int = 0  # a group with fewer valid runs is dropped as few_valid_runs
    top_up: bool = False  # later rounds draw only the groups still missing, not a whole round (runs cost minutes)
    exhausted_hint: str = "relax rollout.dynamic_filter or reward.on_invalid"


async def collect(cfg: SlimeConfig, source: PromptSource, run_group: GroupRunner,
                  filters: Filters = Filters()) -> RolloutResult:
    """Pull groups until `rollout.batch_size` of them pass the filters; extras are discarded."""
    from slimecli.reward import apply_invalid_policy, assign_rewards, reward_metrics

    r = cfg.rollout
    start = time.perf_counter()
    kept: list[tuple[list[Sample], list[float]]] = []
    drops: dict[str, int] = {}
    all_scored: list[Sample] = []
    groups_seen = 0
    while len(kept) < r.batch_size:
        if groups_seen >= MAX_OVERSAMPLING * r.batch_size:
            raise RuntimeError(f"only {len(kept)} of rollout.batch_size={r.batch_size} groups passed the filters "
                               f"after {groups_seen} groups (dropped: {drops}); {filters.exhausted_hint}")
        first = groups_seen == 0 or not filters.top_up
        records = source.next((r.over_sampling_batch_size or r.batch_size) if first else r.batch_size - len(kept))
        groups = await asyncio.gather(*(run_group(rec, groups_seen + i) for i, rec in enumerate(records)))
        for rec, runs in zip(records, groups, strict=True):  # which prompt of the run's stream each sample answers
            for s in (s for run in runs for s in run):
                s.metadata.setdefault("position", rec.get("position"))
        groups_seen += len(groups)
        flat = [s for runs in groups for run in runs for s in run]
        await assign_rewards(flat, cfg.reward, log)
        scored = apply_invalid_policy(flat, cfg.reward.key, cfg.reward.on_invalid)
        all_scored.extend(flat)
        dropped = set(scored.dropped)
        pos = 0
        for runs in groups:
            samples = [s for run in runs for s in run]
            positions = range(pos, pos + len(samples))
            rewards = scored.rewards[pos:pos + len(samples)]
            pos += len(samples)
            counted = [reward for reward, s in zip(rewards, samples, strict=True)
                       if not s.remove_sample and s.metadata.get("branch", 0) == 0]
            reason = None
            if dropped.intersection(positions):
                reason = "invalid_reward"
            elif sum(any(not s.remove_sample for s in run) for run in runs) < filters.min_valid_runs:
                reason = "few_valid_runs"
            elif r.dynamic_filter == "zero_std" and sample_std(counted) <= 1e-6:
                reason = "zero_std"
            if reason is None:
                kept.append((samples, rewards))
            else:
                drops[reason] = drops.get(reason, 0) + 1
    kept = sorted(kept[: r.batch_size], key=lambda item: item[0][0].index)
    samples = [s for g, _ in kept for s in g]
    rewards = [x for _, rs in kept for x in rs]
    metrics = batch_metrics(samples, time.perf_counter() - start, groups_seen, drops)
    metrics.update(reward_metrics(all_scored, cfg.reward.key, filter_drops=drops))
    return RolloutResult(samples, rewards, metrics)


def batch_metrics(samples: list[Sample], elapsed: float, groups_seen: int, drops: dict[str, int]) -> dict[str, Any]:
    lengths = [s.response_length for s in samples]
    return {
        "rollout/time_s": elapsed,
        "rollout/groups_generated": groups_seen,
        "rollout/samples": len(samples),
        "rollout/response_len_mean": sum(lengths) / max(len(lengths), 1),
        "rollout/response_len_max": max(lengths, default=0),
        "rollout/response_len_min": min(lengths, default=0),
        "rollout/truncated_ratio": sum(s.status == Status.TRUNCATED for s in samples) / max(len(samples), 1),
        "rollout/tokens_per_s": sum(lengths) / elapsed if elapsed > 0 else 0.0,
        **{f"rollout/dropped_{k}": v for k, v in drops.items()},
    }


def sample_std(values: list[float]) -> float:
    """Unbiased standard deviation; 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
