"""Rank 0's records of a run: one RUN/metrics.jsonl row per step, the progress line, the invalid-reward count, and
RUN/prompts.jsonl: the prompt-stream positions each step trained on ({"step", "positions"}), which shows that a
resumed run trains no prompt twice and skips none.

The coordinator keeps them; no other rank writes any. A step's row is built before its checkpoint, which
keeps it, and logged after, with the save's time, and with its evaluation's metrics where one is due at that
step (the evaluation at start: a row of its own, step 0): a row waits for them, and the rows after it keep
their order. A resume logs the row of a checkpoint whose metrics line a kill cut off, once its evaluation is in.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from slimecli.config.groups.observe import ObserveConfig
from slimecli.observe.metrics import MetricsLogger, drop_steps_after, read_metrics
from slimecli.observe.progress import RecentRewards, StepProgress, reward_text
from slimecli.observe.restarts import RESTARTS_FILE, count_restarts
from slimecli.process import RESTART_ENV
from slimecli.reward.stats import RewardMeter
from slimecli.train.stages import StageTimer, StepBatch

TRAIN_STAGES = ("old_logp", "ref_logp", "advantages", "update")  # what time/train_s adds up
PROMPTS_FILE = "prompts.jsonl"


class StepRecords:
    """Opened once the engines are up (and a resumed run's weights pushed), closed at the end of the run."""

    def __init__(self, run_dir: Path, max_steps: int, step: int, reward_key: str | None,
                 restored_row: dict[str, Any] | None, observe: ObserveConfig | None = None) -> None:
        self.meter = RewardMeter(reward_key)  # counts the invalid rewards
        self.recent = RecentRewards()
        # observe: the run's settings as this rank has them (None: read again from RUN/config.yaml)
        self.metrics_log = MetricsLogger(run_dir, resume_step=step, observe=observe)
        # rows waiting for their step's evaluation; a resume's first: the checkpoint's row a kill cut off
        self.held: dict[int, dict[str, Any]] = {}
        self.ended: dict[int, float] = {}  # when a held row's step ended: its row's time
        self.start_written = step in _logged_steps(self.metrics_log.path)  # the row of the step it starts from
        if restored_row is not None and not self.start_written:
            self.held[step] = dict(restored_row)
        self.prompts_path = run_dir / PROMPTS_FILE
        drop_steps_after(self.prompts_path, step)
        self.prompts = self.prompts_path.open("a", encoding="utf-8")
        self.attempt = int(os.environ.get(RESTART_ENV, "0") or 0)  # run.max_restarts: this attempt's number
        self.restarts_path = run_dir / RESTARTS_FILE  # the engines and teachers the supervisor restarted
        if step > 0:  # a resume: the window goes on from the steps trained before
            self.recent.seed(read_metrics(run_dir), step)
        self.progress = StepProgress(max_steps, step)

    def row(self, step: int, batch: StepBatch, metrics: dict[str, float], evaluated: dict[str, Any],
            timer: StageTimer, started: float) -> dict[str, Any]:
        """Step ``step``'s metrics row (without the stage times, which the save is not yet part of)."""
        self.meter.update(batch.samples)
        tokens = sum(s.response_length for s in batch.samples)
        step_s = time.perf_counter() - started
        train_s = sum(timer.seconds[k] for k in TRAIN_STAGES)
        return {**batch.metrics, **metrics, **evaluated, "time/step_s": step_s, "time/train_s": train_s,
                "perf/tokens_per_s": tokens / step_s, "weight_version": step, **gpu_memory(),
                "run/restarts": self.attempt, "run/server_restarts": count_restarts(self.restarts_path)}

    def awaits_evaluation(self, step: int) -> bool:
        """Whether the evaluation of ``step``, the step the records were opened at (where one is due), belongs in a
        row not yet written: the start of a run, or a resume whose checkpoint's row was cut off before its
        evaluation was in."""
        return not self.start_written and self.held.get(step, {}).get("eval/weight_version") != step

    def log(self, step: int, row: dict[str, Any], timer: StageTimer, batch: StepBatch, eval_line: str) -> None:
        """The row with every stage's time, held for write_rows(), and the step's rewards (and ``eval_line``, an
        evaluation just in, if any) to the progress line."""
        self.held[step] = {**self.held.get(step, {}), **row, **timer.metrics()}
        self.ended[step] = time.time()
        positions = sorted({p for s in batch.samples if isinstance(p := s.metadata.get("position"), int)})
        self.prompts.write(json.dumps({"step": step, "positions": positions}) + "\n")
        self.prompts.flush()
        self.recent.add(batch.metrics.get("reward/mean"))
        text = reward_text(batch.metrics.get("reward/mean"), self.recent)
        if self.meter.invalid:
            text = f"{text} ({self.meter.invalid} invalid rewards so far)"
        if eval_line:
            text = f"{text} | {eval_line}"
        self.progress.update(step, text)

    def write_rows(self, evaluations: list[tuple[int, dict[str, Any]]], awaiting: set[int]) -> None:
        """The evaluations just in joined to their steps' rows, then every held row up to the first that still
        awaits an evaluation (of a step in ``awaiting``) to metrics.jsonl, in step order."""
        for step, metrics in evaluations:
            if step not in self.held:  # the evaluation at start: a row of its own, in time before the rows after it
                self.ended[step] = min([time.time(), *(t for k, t in self.ended.items() if k > step)])
            self.held.setdefault(step, {}).update(metrics)
        for step in sorted(self.held):
            if any(pending <= step for pending in awaiting):
                return
            self.metrics_log.log(step, self.held.pop(step), at=self.ended.pop(step, None))

    def close(self) -> None:
        """A row still waiting (the run failed, its evaluation dropped) is written without it: nothing is lost."""
        self.write_rows([], set())
        self.progress.close()
        self.metrics_log.close()
        self.prompts.close()


def gpu_memory() -> dict[str, float]:
    """Rank 0's peak GPU memory so far (torch's allocator), where the trainer runs on a GPU."""
    if not torch.cuda.is_available():
        return {}
    return {"perf/gpu_peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30}


def _logged_steps(path: Path) -> set[int]:
    steps = set()
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        try:
            steps.add(int(json.loads(line)["step"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue  # a line cut by a kill
    return steps
