"""Rewards: the registry and built-in functions, assign_rewards (which picks and calls them), normalisation of raw
rewards into training values, and monitoring that never raises on a reward value."""

from slimecli.reward.assign import assign_rewards
from slimecli.reward.normalize import (
    Invalid,
    InvalidRewardError,
    RewardBatch,
    apply_invalid_policy,
    normalize_reward,
    sample_reward,
)
from slimecli.reward.registry import get_reward, register_reward, reward_names
from slimecli.reward.stats import RewardMeter, reward_metrics, value_metrics

__all__ = [
    "Invalid",
    "InvalidRewardError",
    "RewardBatch",
    "RewardMeter",
    "apply_invalid_policy",
    "assign_rewards",
    "get_reward",
    "normalize_reward",
    "register_reward",
    "reward_metrics",
    "reward_names",
    "sample_reward",
    "value_metrics",
]
