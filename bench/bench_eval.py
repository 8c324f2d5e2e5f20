"""What held-out evaluation costs the quickstart, and what it shows: `slimecli train` with its default
evaluation (at start and end) against the same run without evaluation, interleaved.

Each pair runs the quickstart twice, with eval (the default) and with `eval.at_start=false eval.at_end=false`,
in fresh run directories, one after the other (--repeats K pairs, default 1, alternating which goes first), so
that machine noise hits both sides. It prints each run's wall time (the whole command: engines, trainer,
evaluation, export) and the ratio with / without; then two figures from the eval run alone, free of the
machine's run-to-run noise: the eval stage's share of the steps' time (sum of time/eval_s over time/step_s)
and the run's wall time over its wall time less the eval stage; and the eval gain: eval/heldout/reward_mean
and pass@1 at the start (the first row, eval/weight_version 0) and at the end.

Usage: python bench/bench_eval.py [--repeats 1] [--run-root DIR] [override ...]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NO_EVAL = ("eval.at_start=false", "eval.at_end=false", "eval.interval=0")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(run_dir: Path, overrides: list[str]) -> tuple[float, list[dict]]:
    argv = [sys.executable, "-m", "slimecli", "train", f"run.dir={run_dir}", f"rollout.port={free_port()}", *overrides]
    started = time.perf_counter()
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({out.returncode}):\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return wall, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--run-root", type=Path, default=None)
    args, overrides = parser.parse_known_args()
    root = args.run_root or Path(tempfile.mkdtemp(prefix="bench-eval-"))
    walls: dict[str, list[float]] = {"eval": [], "no_eval": []}
    shares, gains, inside = [], [], []
    for i in range(args.repeats):
        order = ["eval", "no_eval"] if i % 2 == 0 else ["no_eval", "eval"]
        for side in order:
            wall, rows = run(root / f"{side}-{i}", [*overrides, *(NO_EVAL if side == "no_eval" else ())])
            walls[side].append(wall)
            print(f"run {i} {side:8s} wall {wall:6.1f} s", flush=True)
            if side == "eval":
                eval_s = sum(r.get("time/eval_s", 0.0) for r in rows)
                shares.append(eval_s / sum(r.get("time/step_s", 0.0) for r in rows))
                inside.append(wall / (wall - eval_s))
                evals = [r for r in rows if "eval/heldout/reward_mean" in r]
                gains.append((evals[0], evals[-1]))
    with_eval, without = statistics.mean(walls["eval"]), statistics.mean(walls["no_eval"])
    print(f"\nwall time with eval {with_eval:.1f} s, without {without:.1f} s: ratio {with_eval / without:.3f} "
          "(goal <= 1.10)")
    print(f"eval stage share of the steps' time: {statistics.mean(shares):.1%}; the run's wall over its wall less "
          f"the eval stage: {statistics.mean(inside):.3f} (the same ratio measured inside one run, free of the "
          "machine's run-to-run noise)")
    for start, end in gains:
        print(f"eval gain on held-out prompts: reward_mean {start['eval/heldout/reward_mean']:.3f} -> "
              f"{end['eval/heldout/reward_mean']:.3f}, pass@1 {start['eval/heldout/pass@1']:.2f} -> "
              f"{end['eval/heldout/pass@1']:.2f} (weights of step {start['eval/weight_version']} -> "
              f"{end['eval/weight_version']})")


if __name__ == "__main__":
    main()
