"""What a training run keeps of its agent runs, under RUN/agent/: the last agent.keep_runs runs (transcript,
diff, outcome) and one row per task and step in tasks.jsonl, so a user can read what the model did and which
tasks it solves without replaying anything.

    RUN/agent/tasks.jsonl                     {"step", "instance_id", "runs", "valid", "resolved", "aborted"}
    RUN/agent/runs/step_000003/<task>-r<slot>/ run.json, transcript.txt, diff.patch
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from slimecli.rollout.sample import Sample

RUN_FIELDS = ("agent", "engine", "sandbox", "exit_code", "timed_out", "elapsed_s", "turns", "ill_formed_turns",
              "tool_calls", "context_truncated", "num_branches", "sandbox_s", "engine_s", "grade_s", "cli_stdout",
              "cli_stderr", "error", "abort_reason")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class RunArchive:
    def __init__(self, root: Path, keep: int, decode: Callable[[list[int]], str] | None = None) -> None:
        self.root = Path(root)
        self.keep = keep
        self.decode = decode

    def record(self, step: int, runs: Iterable[Any]) -> None:
        """Every run of one rollout: a tasks.jsonl row per task, and the runs themselves (the newest kept)."""
        runs = list(runs)
        self.root.mkdir(parents=True, exist_ok=True)
        by_task: dict[str, list[Any]] = {}
        for run in runs:
            by_task.setdefault(_instance(run.samples), []).append(run)
        with (self.root / "tasks.jsonl").open("a") as f:
            for instance, task_runs in by_task.items():
                grades = [r.grade for r in task_runs if r.grade is not None]
                row = {"step": step, "instance_id": instance, "runs": len(task_runs),
                       "valid": sum(r.valid for r in task_runs),
                       "resolved": sum(int(bool(g.get("resolved"))) for g in grades),
                       "aborted": sum(r.grade is None for r in task_runs)}
                f.write(json.dumps(row) + "\n")
        if self.keep > 0:
            step_dir = self.root / "runs" / f"step_{step:06d}"
            for run in runs[-self.keep:]:
                self._write_run(step_dir, run)
            self._prune()

    def _write_run(self, step_dir: Path, run: Any) -> None:
        first = run.samples[0]
        name = _UNSAFE.sub("_", f"{_instance(run.samples)}-r{first.index}")
        out = step_dir / name
        out.mkdir(parents=True, exist_ok=True)
        meta = first.metadata
        info: dict[str, Any] = {"instance_id": _instance(run.samples), "slot": first.index,
                                "rollout_id": first.rollout_id, "attempts": len(run.seconds),
                                "attempt_aborts": list(run.aborts), "seconds": [round(s, 3) for s in run.seconds],
                                "reward": first.reward if isinstance(first.reward, int | float | Mapping) else None,
                                "removed": all(s.remove_sample for s in run.samples)}
        info.update({k: meta[k] for k in RUN_FIELDS if k in meta})
        (out / "run.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
        (out / "diff.patch").write_text(str(meta.get("diff", "")))
        (out / "transcript.txt").write_text(self._transcript(run.samples))

    def _transcript(self, samples: list[Sample]) -> str:
        parts = []
        for s in samples:
            head = f"===== branch {s.metadata.get('branch', 0)} ({len(s.tokens)} tokens, {s.response_length} response)"
            text = self.decode(list(s.tokens)) if self.decode is not None and s.tokens else (s.response or "")
            parts.append(f"{head}\n{text}\n")
        return "\n".join(parts)

    def _prune(self) -> None:
        """Keep the newest `keep` run directories over all steps."""
        dirs = sorted((d for step in (self.root / "runs").iterdir() if step.is_dir() for d in step.iterdir()),
                      key=lambda d: (d.parent.name, d.stat().st_mtime_ns))
        for old in dirs[: max(0, len(dirs) - self.keep)]:
            shutil.rmtree(old, ignore_errors=True)
        for step in (self.root / "runs").iterdir():
            if step.is_dir() and not any(step.iterdir()):
                step.rmdir()


def _instance(samples: list[Sample]) -> str:
    return str(samples[0].metadata.get("instance_id", "task")) if samples else "task"
