"""The quickstart learned by each algorithm, one after the other in one run of this script: GRPO (the default, the
baseline), CISPO, Dr. GRPO, PPO with a critic (GAE) and GRPO with DAPO's overlong shaping. For each: the first step
whose mean reward reaches the goal, the final reward and response length (means of the last 5 steps), the best
step, and the wall and CPU time of its `slimecli train` (all its processes: on a shared machine the wall time
follows the load).

Issue 43's goal: the quickstart reaches a mean reward >= 0.95 with CISPO (the exit status is 1 when it does not).

    python bench/bench_algorithms.py [--steps 60] [--goal 0.95] [--only cispo,gae] [extra overrides...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from train_runs import train

ALGORITHMS = {
    "grpo": [],
    "cispo": ["trainer.policy_loss=cispo"],
    "dr_grpo": ["trainer.scale_by_std=false", "trainer.loss_reduction=token_sum_norm"],
    "gae": ["trainer.advantage_estimator=gae"],
    "overlong": ["trainer.overlong_buffer=4"],
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--goal", type=float, default=0.95)
    ap.add_argument("--only", default=",".join(ALGORITHMS), help="comma-separated: " + ", ".join(ALGORITHMS))
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    names = [n for n in a.only.split(",") if n]
    unknown = [n for n in names if n not in ALGORITHMS]
    if unknown:
        sys.exit(f"unknown algorithm(s) {', '.join(unknown)}; known: {', '.join(ALGORITHMS)}")
    common = [f"trainer.max_steps={a.steps}", "trainer.save_interval=0", "eval.at_start=false", "eval.at_end=false",
              *a.overrides]
    tmp = Path(tempfile.mkdtemp(prefix="bench-algorithms-"))
    print(f"quickstart, {a.steps} steps; goal: mean reward >= {a.goal}")
    print(f"{'':10}{'first step >= goal':>20}{'final (last 5)':>16}{'best':>8}{'length':>8}{'wall s':>9}{'CPU s':>9}")
    reached = {}
    for name in names:
        wall, cpu, rows = train(tmp / name, common + ALGORITHMS[name])
        rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
        first = next((r["step"] for r in rows if r.get("reward/mean", 0.0) >= a.goal), None)
        reached[name] = first is not None
        final = sum(rewards[-5:]) / len(rewards[-5:])
        lengths = [r["rollout/response_len_mean"] for r in rows if "rollout/response_len_mean" in r][-5:]
        length = sum(lengths) / max(len(lengths), 1)
        print(f"{name:10}{first if first is not None else 'never':>20}{final:>16.3f}{max(rewards):>8.3f}"
              f"{length:>8.1f}{wall:>9.1f}{cpu:>9.1f}", flush=True)
    if "cispo" in reached and not reached["cispo"]:
        sys.exit(f"cispo never reached {a.goal}")


if __name__ == "__main__":
    main()
