"""The rewards this package provides, declared lazily (slimecli.config.registry); nothing is imported here."""

from slimecli.config.registry import REWARDS

REWARDS.builtin("exact_match", "slimecli.reward.functions:exact_match", inline=True)
REWARDS.builtin("f1", "slimecli.reward.functions:f1", inline=True)
REWARDS.builtin("math", "slimecli.reward.math_answer:math_reward", inline=True)
