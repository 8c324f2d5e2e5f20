"""The names a config may give where a registry of an upper package resolves them.

reward.name (slimecli.reward.registry), trainer.advantage_estimator and trainer.policy_loss
(slimecli.train.registry) name functions those packages register. Config validation cannot import them
(config is the lowest layer, and validating must not import torch), so the built-in names are listed
here, and a test checks them against the registries. A name registered at run time is declared here
by its registry (`declare`), so that a config using it validates in the same process.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

REWARD = "reward.name"
ADVANTAGE_ESTIMATOR = "trainer.advantage_estimator"
POLICY_LOSS = "trainer.policy_loss"

BUILTIN: dict[str, tuple[str, ...]] = {
    REWARD: ("exact_match", "f1", "math", "python", "quickstart", "remote", "swe_tests"),
    ADVANTAGE_ESTIMATOR: ("grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"),
    POLICY_LOSS: ("ppo_clip",),
}
# What each registry calls its entries, for the rule messages.
KINDS = {REWARD: "reward", ADVANTAGE_ESTIMATOR: "advantage estimator", POLICY_LOSS: "policy loss"}
# Accepted but not listed: gspo is grpo's advantages with a sequence-level importance ratio.
DEPRECATED_ADVANTAGE_ESTIMATORS = {"gspo": "grpo"}

_declared: dict[str, dict[str, None]] = {key: {} for key in BUILTIN}


def declare(key: str, name: str) -> None:
    """A registry registered `name` for the field `key` (one of BUILTIN's keys)."""
    if key not in _declared:
        raise KeyError(f"{key!r} is not a registry-backed config field ({', '.join(BUILTIN)})")
    _declared[key][name] = None


def names(key: str) -> list[str]:
    """Built-in names first, then those declared in this process, each once."""
    return list(dict.fromkeys([*BUILTIN[key], *_declared[key]]))


@contextmanager
def scoped() -> Iterator[None]:
    """Names declared inside the with-block are forgotten after it (the registries' scoped overrides use it)."""
    saved = {key: dict(declared) for key, declared in _declared.items()}
    try:
        yield
    finally:
        for key, declared in _declared.items():
            declared.clear()
            declared.update(saved[key])
