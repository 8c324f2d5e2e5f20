"""Where a quickstart training step spends its time: per-stage shares of `slimecli train`.

Runs the real quickstart (2 trainer ranks, 1 engine, on CPU) for a few steps, then reads the run's
metrics.jsonl: the mean over steps (the first is warm-up and left out; means, unlike medians, add up) of
time/step_s and of every stage's time/<stage>_s (rollout, old_logp, ref_logp, advantages, update,
sync_weights, save), with each stage's share of the step. The stages plus the metrics bookkeeping make
up the step; save runs after time/step_s is taken (and only on the last step here), so it is outside it.

--baseline RUN reads another run's metrics.jsonl (say, one made by an older checkout, which only logs
time/step_s, time/rollout_s and time/train_s) and prints its step time beside this one.

Usage: python bench/bench_train_step.py [--steps 10] [--baseline RUN_DIR] [--run-dir DIR] [override ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("rollout", "old_logp", "ref_logp", "advantages", "update", "sync_weights", "save")


def run_quickstart(run_dir: Path, steps: int, overrides: list[str]) -> None:
    argv = [sys.executable, "-m", "slimecli", "train", f"run.dir={run_dir}", f"trainer.max_steps={steps}",
            "trainer.save_interval=0", *overrides]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"slimecli train failed ({out.returncode}):\n{out.stdout[-3000:]}{out.stderr[-3000:]}")


def means(run_dir: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = rows[1:] if len(rows) > 1 else rows  # step 1 pays for warm-up
    keys = {k for row in steady for k in row if k.startswith("time/")}
    return {k: statistics.fmean(row[k] for row in steady if k in row) for k in sorted(keys)}


def report(times: dict[str, float], baseline: dict[str, float] | None) -> None:
    step = times["time/step_s"]
    print(f"step (mean): {step * 1000:8.1f} ms")
    for name in STAGES:
        seconds = times.get(f"time/{name}_s")
        if seconds is not None:
            print(f"  {name:<13} {seconds * 1000:8.1f} ms  {100 * seconds / step:5.1f}%")
    if baseline is not None:
        old = baseline["time/step_s"]
        print(f"baseline step (mean): {old * 1000:8.1f} ms   this / baseline = {step / old:.3f}")
        for key in ("time/rollout_s", "time/train_s"):
            if key in baseline and key in times:
                print(f"  {key:<15} {baseline[key] * 1000:8.1f} ms -> {times[key] * 1000:8.1f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--run-dir", type=Path, help="where to run (default: a temporary directory)")
    parser.add_argument("--baseline", type=Path, help="a run directory to compare step times with")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for slimecli train")
    args = parser.parse_args()
    baseline = means(args.baseline) if args.baseline is not None else None
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        run_dir = args.run_dir or Path(tmp) / "run"
        run_quickstart(run_dir, args.steps, args.overrides)
        report(means(run_dir), baseline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
