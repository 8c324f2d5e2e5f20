"""Rewards by name: `reward=name` (or sample.metadata["rm_type"] = name) -> the function that scores a sample.

A reward is `fn(sample)` (or `fn(samples)` for a group reward), sync or async, and returns a raw reward (float,
int, bool, dict, ...; see values.py). The names live in the one plugin registry (slimecli.config.registry);
built-ins are declared by the packages that own them (reward/plugins.py, rollout/plugins.py, swe/plugins.py).
`remote` and `python` depend on the config (url, path) and are built by assign_rewards rather than registered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from slimecli.config.registry import REWARDS, UnknownPluginError


@dataclass(frozen=True)
class RewardFn:
    name: str
    fn: Callable[..., Any]
    group: bool = False  # fn(samples of one group) -> list of rewards
    inline: bool = False  # cheap pure function: called in the event loop, not in a worker thread


class UnknownRewardError(UnknownPluginError):
    """No reward of that name (its class name is what a sample's metadata.reward_error records)."""


def register_reward(name: str, fn: Callable[..., Any], group: bool = False, *, inline: bool = False) -> None:
    """Make `reward=name` (and sample.metadata["rm_type"] = name) call `fn`. A name bound to another function is
    refused (ValueError); the same function again is a no-op.

    group=True: fn receives the list of samples of one group and returns one reward per sample.
    inline=True: fn is cheap and synchronous, so it runs in the event loop instead of a thread.
    """
    REWARDS.register(name, fn, group=group, inline=inline)


@contextmanager
def scoped_rewards() -> Iterator[None]:
    """Rewards registered inside the with-block are gone after it (and replaced ones come back): tests use it."""
    with REWARDS.scoped():
        yield


def reward_names() -> list[str]:
    """Every name a config may use for reward.name."""
    return sorted(REWARDS.names())


def get_reward(name: str) -> RewardFn:
    """The registered reward `name`; raises UnknownRewardError (with a did-you-mean) when there is none."""
    try:
        entry = REWARDS.get(name)
    except UnknownPluginError as exc:
        raise UnknownRewardError(str(exc)) from None
    return RewardFn(name, entry.obj, group=bool(entry.options.get("group")), inline=bool(entry.options.get("inline")))
