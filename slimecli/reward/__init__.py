"""Rewards: the registry and built-in functions, assign_rewards (which picks and calls them), conversion of raw
rewards into training values, and monitoring that never raises on a reward value."""

from slimecli.reward.assign import assign_rewards
from slimecli.reward.registry import get_reward, register_reward, reward_names
from slimecli.reward.stats import RewardMeter, reward_metrics, value_metrics
from slimecli.reward.values import (
    Invalid,
    InvalidRewardError,
    RewardBatch,
    apply_invalid_policy,
    reward_value,
    sample_reward,
)

__all__ = [
    "Invalid",
    "InvalidRewardError",
    "RewardBatch",
    "RewardMeter",
    "apply_invalid_policy",
    "assign_rewards",
    "get_reward",
    "reward_value",
    "register_reward",
    "reward_metrics",
    "reward_names",
    "sample_reward",
    "value_metrics",
]
