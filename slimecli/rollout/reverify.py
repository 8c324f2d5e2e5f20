"""`slimecli rollout reverify`: the rewards of dumped samples computed again with a reward config, and what
changed. A reward function fixed after a run (or a stricter one) shows which samples it would have scored
otherwise, without a new rollout."""

from __future__ import annotations

import asyncio
import copy
import logging
from dataclasses import dataclass
from pathlib import Path

from slimecli.config.groups.reward import RewardConfig
from slimecli.reward import assign_rewards, sample_reward
from slimecli.reward.values import Invalid
from slimecli.rollout.dump import dumped_steps, read_step

log = logging.getLogger("slimecli.rollout")


@dataclass(frozen=True)
class Change:
    step: int
    index: int  # the sample's index in the run
    before: float | None  # None: invalid
    after: float | None


@dataclass
class Reverified:
    steps: int
    samples: int
    changes: list[Change]


async def reverify(root: Path, reward: RewardConfig) -> Reverified:
    """Every dumped step of ``root`` scored again with ``reward``. A sample left out of training as a placeholder
    (an aborted agent run) keeps its reward, as it did when it was scored."""
    steps = dumped_steps(root)
    changes: list[Change] = []
    total = 0
    for step in steps:
        dumped = read_step(root, step)
        again = [copy.deepcopy(s) for s in dumped.samples]
        for s in again:
            if not (s.remove_sample and s.reward is not None):
                s.reward = None
        await assign_rewards(again, reward, log)
        for old, new in zip(dumped.samples, again, strict=True):
            before, after = _value(old, reward.key), _value(new, reward.key)
            if before != after:
                changes.append(Change(step, old.index, before, after))
        total += len(again)
    return Reverified(len(steps), total, changes)


def run_reverify(root: Path, reward: RewardConfig) -> Reverified:
    return asyncio.run(reverify(root, reward))


def _value(sample: object, key: str | None) -> float | None:
    value = sample_reward(sample, key)
    return None if isinstance(value, Invalid) else float(value)
