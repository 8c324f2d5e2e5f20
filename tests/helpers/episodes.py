"""An environment's episode played in a test: the policy's turns given in advance, as an adapter's user sees them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from slimecli.env.protocol import Action, Observation, StepResult
from slimecli.env.provider import EnvProvider


def say(text: str) -> Action:
    """A turn of plain text: no reasoning, no tool calls."""
    return Action(text=text, content=text)


async def play(provider: EnvProvider, row: Mapping[str, Any],
               turns: Sequence[Action | str]) -> tuple[Observation, list[StepResult]]:
    """Reset with `row`, step through `turns` (a string is said) until one ends the episode, and close it: the first
    observation and each step's result."""
    env = provider.episode()
    obs = await env.reset(row)
    results: list[StepResult] = []
    try:
        for turn in turns:
            results.append(await env.step(say(turn) if isinstance(turn, str) else turn))
            if results[-1].done:
                break
    finally:
        await env.close()
    return obs, results
