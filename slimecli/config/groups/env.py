"""An RL environment (slimecli/env/): which library's environment the policy is trained in, and its budgets.

Not a SWE task's environment (task.environment: the packages a coding task runs with)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from slimecli.config.decode import spec

EnvKind = Literal["native", "verifiers", "openenv", "skyrl_gym", "reasoning_gym"]


@dataclass(frozen=True)
class EnvSourceConfig:
    """One environment of a mix: `name` labels its samples and metrics (env/<name>/...)."""

    name: str = spec("", nonempty=True)
    env: EnvKind = "native"
    id: str = spec("", nonempty=True)
    args: dict[str, Any] = field(default_factory=dict)
    ratio: float = spec(1.0, gt=0)  # its share of a step's prompts, relative to the other sources


@dataclass(frozen=True)
class EnvConfig:
    """env=none: no environment (the task's prompts and the reward group). Otherwise the episodes of `id` under
    the adapter `name` are the rollout (rollout.generate=env) and their reward is the reward."""

    name: Literal["none", "native", "verifiers", "openenv", "skyrl_gym", "reasoning_gym", "mix"] = "none"
    # a registered name (slimecli env list), an installed package's id, or pkg.module:Name
    id: str | None = None
    args: dict[str, Any] = field(default_factory=dict)  # keyword arguments for the environment
    max_turns: int = spec(8, gt=0)  # policy turns per episode; the episode ends there
    # tokens one turn may sample; null: rollout.max_new_tokens
    max_tokens_per_turn: int | None = spec(None, gt=0)
    # tokens an episode may add after its first prompt (sampled and observations): past it, it is dropped
    max_tokens_per_episode: int = spec(4096, gt=0)
    concurrency: int = spec(32, gt=0)  # episodes in flight at once
    timeout_s: float = spec(60.0, gt=0, resumable=True)  # per reset, step or close
    tool_parser: str = "hermes"  # how tool calls are read from the model's text (the chat template's format)
    # tool_calls: each turn where tools are offered is sampled under a grammar (slimecli.model.tool_grammar): text,
    # or calls whose arguments follow the tools' schemas; forced tokens are context, not trained. A small or
    # random model almost never writes a well-formed call without it.
    constrain: Literal["none", "tool_calls"] = "none"
    tool_choice: Literal["auto", "required"] = "auto"  # constrain=tool_calls: required allows calls only
    parallel_tool_calls: bool = True  # constrain=tool_calls: several calls in one turn
    # every turn without tools is sampled under this regex (the engine's structured outputs): a small model that
    # must answer in a fixed form (a number, yes/no) finds it at all. null: free text
    regex: str | None = spec(None, nonempty=True)
    # env=mix: several environments in one run, each a source with its own label
    mix: tuple[EnvSourceConfig, ...] = ()
    split: str = "train"  # which of the environment's own tasks are trained on (verifiers, reasoning-gym)
