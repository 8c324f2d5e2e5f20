"""What the benches that time whole `slimecli train` runs share: one run's wall and CPU seconds, and its rows."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cpu_s() -> float:
    """CPU seconds of the child processes waited for so far (a `slimecli train` waits for all of its own)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def train(run_dir: Path, overrides: list[str]) -> tuple[float, float, list[dict]]:
    """Wall and CPU seconds of one `slimecli train`, and its metrics rows."""
    argv = [sys.executable, "-m", "slimecli", "train", f"run.dir={run_dir}", "observe.report=false", *overrides]
    started, cpu = time.perf_counter(), cpu_s()
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - started, cpu_s() - cpu
    if out.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({out.returncode}):\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return wall, cpu, rows
