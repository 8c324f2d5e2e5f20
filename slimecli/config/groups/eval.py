from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from slimecli.config.decode import spec
from slimecli.config.groups.env import EnvKind


@dataclass(frozen=True)
class EvalRewardConfig:
    """A dataset's reward: unset keys come from the run's `reward` (or, when `name` picks another reward
    member, from that member's conf/reward/NAME.yaml)."""

    name: str | None = None  # any reward member: exact_match | math | f1 | remote | judge | python | quickstart | swe_tests
    key: str | None = None
    path: str | None = None
    group: bool | None = None
    url: str | None = None
    timeout_s: float | None = spec(None, gt=0)
    max_retries: int | None = spec(None, ge=0)
    backoff_s: float | None = spec(None, ge=0)
    concurrency: int | None = spec(None, gt=0)
    on_invalid: Literal["zero", "drop_group", "error"] | None = None
    partial: bool | None = None
    # reward=judge: this dataset's own rubric and verdict (the judge itself is the run's: docs/judge.md)
    rubric: str | None = None
    verdict: Literal["score", "pass_fail"] | None = None
    verdict_regex: str | None = None
    verdict_schema: str | None = None
    score_max: float | None = spec(None, gt=0)


@dataclass(frozen=True)
class EvalDatasetConfig:
    """One held-out dataset (a task's prompts, or an environment's episodes with `env`); every unset override
    takes the run's rollout (and task) setting."""

    name: str = ""  # metrics are eval/<name>/...; per-sample results RUN/eval/step_<N>/<name>.jsonl
    # quickstart: the quickstart task's held-out prompts; jsonl: a prompt file (path); swe: SWE tasks (path:
    # a SWE-bench JSONL file or builtin:NAME), graded by their tests (rollout.generate=agent runs)
    task: Literal["quickstart", "jsonl", "swe"] = "jsonl"
    path: str | None = None
    # an RL environment's episodes (as env=KIND env.id=ID env.args=...), on its "eval" split (its own eval tasks,
    # else `path`'s rows, each passed to reset), with the run's env budgets; the reward is the episode's
    env: EnvKind | None = None
    id: str | None = None  # env: the environment to load (slimecli env list)
    args: dict[str, Any] = field(default_factory=dict)  # env: keyword arguments for the environment
    prompt_key: str = "prompt"  # jsonl
    label_key: str = "label"  # jsonl
    max_samples: int | None = spec(None, ge=1, note="null: every prompt")  # evaluate the first N prompts (tasks) only; null: all of them
    n_samples_per_prompt: int | None = spec(None, ge=1)
    max_new_tokens: int | None = spec(None, gt=0)
    temperature: float | None = spec(None, gt=0)
    top_p: float | None = spec(None, gt=0, le=1)
    top_k: int | None = spec(None, ge=1, also=(-1,), note="-1: all")
    stop: tuple[str, ...] | None = spec(None, nonempty=True)
    max_prompt_len: int | None = spec(None, gt=0)
    apply_chat_template: bool | None = None
    reward: EvalRewardConfig = field(default_factory=EvalRewardConfig)
    pass_threshold: float = spec(1.0, note="rewards are any number, so is the threshold")  # a sample passes (for pass@k) when its reward is >= this


@dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation during training (on the engines, with the current weights) and `slimecli eval`."""

    interval: int = spec(0, ge=0, note="0: no evaluation between steps")  # evaluate every N training steps; 0: never in between
    at_start: bool = False  # before the first step (the initial weights)
    at_end: bool = False  # after the last step
    datasets: tuple[EvalDatasetConfig, ...] = ()
