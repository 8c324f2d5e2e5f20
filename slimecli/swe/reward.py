"""reward=swe_tests: an agent run grades its own diff (slimecli.agent.harness.jobs.SweJob.score), so the reward layer
passes the grade through; a sample without one was never graded and gets a reward error, not a silent 0."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class Ungraded(ValueError):
    """The sample reached the reward layer without the grade its agent run attaches."""


def swe_tests(sample: Any) -> Any:
    """The grade dict {resolved, f2p, p2p, applied, touched_tests, reward} the run attached (or its 0.0)."""
    reward = sample.reward
    if isinstance(reward, Mapping) or isinstance(reward, int | float) and not isinstance(reward, bool):
        return reward
    raise Ungraded("reward=swe_tests grades inside the agent run (rollout.generate=agent); this sample carries "
                   f"no grade (reward {type(reward).__name__})")
