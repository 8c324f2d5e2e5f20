"""Rollout dumps: each step's samples on disk (rollout.dump=true), read back to train without engines
(rollout.replay) or to score again (`slimecli rollout reverify`).

RUN/rollouts/step_<k>.jsonl, k the step that trained on them (its metrics row's step). The first line is the
header: {"format": "slimecli.rollout/1", "step": k, "metrics": the rollout's metrics}; then one line per sample,
in batch order: every Sample field (tokens, response_length, loss_mask, rollout_log_probs, teacher_log_probs,
weight_versions, token_versions, reward, remove_sample, status, metadata, ...) plus "train_reward", the value
the advantages used (an invalid reward already resolved). "response" is the decoded response: with an agent or
an environment, its turns and their tool and environment messages.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slimecli.observe.metrics import to_json_value
from slimecli.rollout.sample import Sample

FORMAT = "slimecli.rollout/1"
DIR = "rollouts"


@dataclass
class DumpedStep:
    step: int
    samples: list[Sample]
    train_rewards: list[float]
    metrics: dict[str, Any]


def step_path(root: Path, step: int) -> Path:
    return root / f"step_{step}.jsonl"


def dump_dir(path: str | Path) -> Path:
    """The folder of dumps a path names: a run directory (its rollouts/) or the folder itself."""
    path = Path(path).expanduser()
    return path / DIR if (path / DIR).is_dir() else path


def dumped_run(path: str | Path) -> Path | None:
    """The run directory whose dumps these are (its checkpoints start a replay of chosen steps), if any."""
    root = dump_dir(path)
    return root.parent if root.name == DIR else None


def dumped_steps(root: Path) -> list[int]:
    return sorted(int(p.stem.removeprefix("step_")) for p in root.glob("step_*.jsonl")
                  if p.stem.removeprefix("step_").isdigit())


def write_step(run_dir: Path, step: int, samples: list[Sample], train_rewards: list[float],
               metrics: dict[str, Any]) -> Path:
    """Step ``step``'s samples, written whole or not at all (a temporary file renamed)."""
    root = run_dir / DIR
    root.mkdir(parents=True, exist_ok=True)
    path = step_path(root, step)
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(json.dumps({"format": FORMAT, "step": step, "metrics": to_json_value(metrics)}) + "\n")
        for sample, reward in zip(samples, train_rewards, strict=True):
            f.write(json.dumps({**to_json_value(sample.to_dict()), "train_reward": reward}) + "\n")
    os.replace(tmp, path)
    return path


def read_step(root: Path, step: int) -> DumpedStep:
    """Step ``step`` of a dump folder; a missing or malformed file is a ValueError naming it and the line."""
    path = step_path(root, step)
    if not path.is_file():
        have = dumped_steps(root)
        raise ValueError(f"{path}: no dump of step {step} (dumped: {_steps_text(have)})")
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    try:
        header = json.loads(lines[0]) if lines else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:1: not JSON ({exc.msg})") from None
    if header.get("format") != FORMAT:
        raise ValueError(f"{path}:1: not a rollout dump (format {header.get('format')!r}, expected {FORMAT!r})")
    samples, rewards = [], []
    fields = set(Sample.__dataclass_fields__)
    for n, line in enumerate(lines[1:], 2):
        try:
            row = json.loads(line)
            rewards.append(float(row.pop("train_reward")))
            samples.append(Sample.from_dict({k: v for k, v in row.items() if k in fields}))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}:{n}: not a dumped sample ({type(exc).__name__}: {exc})") from None
    return DumpedStep(int(header.get("step", step)), samples, rewards, dict(header.get("metrics") or {}))


def _steps_text(steps: list[int]) -> str:
    if not steps:
        return "none"
    return ", ".join(map(str, steps)) if len(steps) <= 8 else f"{steps[0]}..{steps[-1]} ({len(steps)} steps)"
