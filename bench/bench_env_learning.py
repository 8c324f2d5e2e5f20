"""The built-in tool environment's whole learning curve (recipe env_lookup, tiny model, CPU): the mean episode reward
per step, from under 0.2 to at least 0.9 within 5 minutes of training steps (the goal); and the reasoning_gym
recipe's curve, on which the last 10 steps' mean must beat the first 10's by at least 0.1.

    python bench/bench_env_learning.py [--steps 80] [--seed 1234]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def curve(recipe: str, key: str, steps: int, seed: int, tmp: Path) -> tuple[list[float], list[float]]:
    """(rewards, seconds since the first step began) per step of one run."""
    from slimecli.observe.metrics import read_metrics

    run = tmp / recipe
    argv = [sys.executable, "-m", "slimecli", "train", f"+recipe={recipe}", f"run.dir={run}", f"run.seed={seed}",
            f"trainer.max_steps={steps}", "trainer.save_interval=0", "observe.report=false"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{recipe} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    rows = [r for r in read_metrics(run) if key in r]
    if not rows:
        raise SystemExit(f"{recipe}: no {key} in {run}/metrics.jsonl")
    elapsed, total = [], 0.0
    for r in rows:  # each step's own time: start-up and engine loading are not training time
        total += float(r["time/step_s"])
        elapsed.append(total)
    return [float(r[key]) for r in rows], elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        rewards, elapsed = curve("env_lookup", "env/lookup/reward", args.steps, args.seed, Path(tmp))
        wall = time.perf_counter() - started
        print("env_lookup reward per step: " + " ".join(f"{r:.2f}" for r in rewards))
        reached = next((i for i, r in enumerate(rewards) if r >= 0.9), None)
        first10, last10 = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
        print(f"  first 10 steps {first10:.3f}, last 10 {last10:.3f}; first step {rewards[0]:.3f}")
        if reached is None:
            print(f"  never reached 0.9 in {len(rewards)} steps (command {wall:.0f} s): FAIL")
            ok = False
        else:
            seconds = elapsed[reached]
            met = rewards[0] < 0.2 and seconds <= 300
            print(f"  0.9 first reached at step {reached + 1}, {seconds:.0f} s of training steps (command "
                  f"{wall:.0f} s in all): {'PASS' if met else 'FAIL'} (goal: start < 0.2, 0.9 within 300 s)")
            ok &= met
        rg, _ = curve("reasoning_gym", "env/letter_counting/reward", 40, args.seed, Path(tmp))
        print("reasoning_gym reward per step: " + " ".join(f"{r:.2f}" for r in rg))
        gain = sum(rg[-10:]) / 10 - sum(rg[:10]) / 10
        print(f"  last 10 - first 10: {gain:+.3f} (goal >= +0.1): {'PASS' if gain >= 0.1 else 'FAIL'}")
        ok &= gain >= 0.1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
