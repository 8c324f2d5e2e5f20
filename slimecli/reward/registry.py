"""Reward registry: name -> reward function, so that other modules can add rewards.

A registered reward is `fn(sample)` (or `fn(samples)` for a group reward), sync or async, and
returns a raw reward (float, int, bool, dict, ...; see values.py). Built-ins are imported
lazily; config validation knows their names from slimecli.config.names (a test keeps the two lists
equal). `remote` and `python` depend on the config (url, path) and are built by assign_rewards rather
than registered here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from slimecli.config import names
from slimecli.config.errors import allowed_hint


@dataclass(frozen=True)
class RewardFn:
    name: str
    fn: Callable[..., Any]
    group: bool = False  # fn(samples of one group) -> list of rewards
    inline: bool = False  # cheap pure function: called in the event loop, not in a worker thread


class UnknownRewardError(KeyError):
    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "unknown reward"


# Built-in rewards, imported on first use: name -> ("module:function", group, inline).
_LAZY: dict[str, tuple[str, bool, bool]] = {
    "exact_match": ("slimecli.reward.functions:exact_match", False, True),
    "f1": ("slimecli.reward.functions:f1", False, True),
    "math": ("slimecli.reward.math_answer:math_reward", False, True),
    "quickstart": ("slimecli.rollout.quickstart:quickstart_reward", False, True),
    "swe_tests": ("slimecli.swe.reward:swe_tests", False, True),  # passes through the grade of an agent run
}
# Built by assign_rewards from the config.
CONFIG_BUILT = ("remote", "python")
# Names other modules register at import time; valid in a config before that module is imported.
KNOWN = ("quickstart", "swe_tests")

_REGISTRY: dict[str, RewardFn] = {}


def register_reward(name: str, fn: Callable[..., Any], group: bool = False, *, inline: bool = False) -> None:
    """Make `reward=name` (and sample.metadata["rm_type"] = name) call `fn`; a later call replaces it.

    group=True: fn receives the list of samples of one group and returns one reward per sample.
    inline=True: fn is cheap and synchronous, so it runs in the event loop instead of a thread.
    """
    if not name or not isinstance(name, str):
        raise ValueError(f"reward name must be a non-empty string, got {name!r}")
    if name in CONFIG_BUILT:
        raise ValueError(f"reward {name!r} is built from the config and cannot be registered")
    if not callable(fn):
        raise TypeError(f"reward {name!r}: {fn!r} is not callable")
    _REGISTRY[name] = RewardFn(name, fn, group=group, inline=inline)
    names.declare(names.REWARD, name)  # a config naming it validates in this process


@contextmanager
def scoped_rewards() -> Iterator[None]:
    """Rewards registered inside the with-block are gone after it (and replaced ones come back): tests use it."""
    saved = dict(_REGISTRY)
    try:
        with names.scoped():  # and the names registering declared to config validation
            yield
    finally:
        _REGISTRY.clear()
        _REGISTRY.update(saved)


def reward_names() -> list[str]:
    """Every name a config may use for reward.name."""
    return sorted({*_REGISTRY, *_LAZY, *CONFIG_BUILT, *KNOWN})


def get_reward(name: str) -> RewardFn:
    """The registered reward `name`; raises UnknownRewardError (with a did-you-mean) when there is none."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name in _LAZY:
        target, group, inline = _LAZY[name]
        module, _, attr = target.partition(":")
        fn = getattr(importlib.import_module(module), attr)
        _REGISTRY.setdefault(name, RewardFn(name, fn, group=group, inline=inline))
        return _REGISTRY[name]
    if name in KNOWN:
        raise UnknownRewardError(f"reward {name!r} is not registered yet: import the module that calls "
                                 f"register_reward({name!r}, ...) before computing rewards")
    if name in CONFIG_BUILT:
        raise UnknownRewardError(f"reward {name!r} is built from the config by assign_rewards")
    raise UnknownRewardError(f"unknown reward {name!r}; {allowed_hint(name, reward_names())}")
