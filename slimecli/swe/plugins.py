"""The reward this package provides, declared lazily (slimecli.config.registry); nothing is imported here."""

from slimecli.config.registry import REWARDS

# passes through the grade of an agent run (the grader ran in the agent's rollout)
REWARDS.builtin("swe_tests", "slimecli.swe.reward:swe_tests", inline=True)
