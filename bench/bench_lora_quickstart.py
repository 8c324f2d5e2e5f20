"""The quickstart trained with LoRA against full fine-tuning, one after the other in one run of this script: the
first step whose mean reward reaches the goal, the final reward, and the wall and CPU time of each `slimecli train`
(the CPU seconds of all its processes: on a machine that other jobs share, the wall time follows their load).

Issue 34's goal: `slimecli train trainer.lora.rank=8` on the quickstart reaches mean reward >= 0.9.

    python bench/bench_lora_quickstart.py [--steps 60] [--rank 8] [--goal 0.9] [--nproc 2] [extra overrides...]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from train_runs import train


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--goal", type=float, default=0.9)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    common = [f"trainer.max_steps={a.steps}", f"trainer.nproc={a.nproc}", "trainer.save_interval=0",
              "eval.at_start=false", "eval.at_end=false", *a.overrides]
    tmp = Path(tempfile.mkdtemp(prefix="bench-lora-quickstart-"))
    print(f"quickstart, {a.steps} steps, trainer.nproc={a.nproc}; goal: mean reward >= {a.goal}")
    print(f"{'':10}{'first step >= goal':>20}{'final reward':>14}{'best':>8}{'wall s':>9}{'CPU s':>9}")
    results = {}
    for name, extra in (("full", []), (f"lora r{a.rank}", [f"trainer.lora.rank={a.rank}"])):
        wall, cpu, rows = train(tmp / name.replace(" ", "-"), common + extra)
        rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
        first = next((r["step"] for r in rows if r.get("reward/mean", 0.0) >= a.goal), None)
        results[name] = (wall, cpu)
        print(f"{name:10}{first if first is not None else 'never':>20}{rewards[-1]:>14.3f}{max(rewards):>8.3f}"
              f"{wall:>9.1f}{cpu:>9.1f}", flush=True)
    (full, lora) = results.values()
    print(f"lora / full: wall time {lora[0] / full[0]:.2f}x, CPU time {lora[1] / full[1]:.2f}x")


if __name__ == "__main__":
    main()
