"""reward=env: an episode's reward is what its environment gave (the sum of its steps' rewards), set by the
environment rollout; the reward layer passes it through, and a sample without one is an error, not a silent 0."""

from __future__ import annotations

from typing import Any


class NoEnvironmentReward(ValueError):
    """The sample did not come from an environment episode."""


def env_reward(sample: Any) -> float:
    reward = sample.reward
    if isinstance(reward, int | float) and not isinstance(reward, bool):
        return float(reward)
    raise NoEnvironmentReward("reward=env is the reward of an environment episode (rollout.generate=env); this "
                              f"sample carries none ({type(reward).__name__})")
