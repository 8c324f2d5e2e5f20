"""Rollout overlapped with training (trainer.async_rollout=true) against the synchronous step, side by side.

Each pair runs the same `slimecli train` twice in fresh run directories, synchronous and with the rollout of
step k+1 generated while step k trains, one after the other (--repeats K pairs, alternating which goes first,
so machine noise hits both sides). Two scenarios, both on 1 trainer rank and 1 engine:

- quickstart: the embedded quickstart as shipped (short answers: the rollout and the training step cost
  about the same);
- long_generation: the same task with 64-token answers, as in an agent rollout, where generation dominates
  the step and an overlap can hide only the training part.

It prints, per scenario, the steps per second of the training loop of each side and their ratio (goal >= 1.4x
on the quickstart), the final reward of each side (the mean of reward/mean over the last 10 steps; goal: async
within 0.05 of sync), and the mean off-policy gap the async side trained with. A run's speed is one over its
median time/step_s, the first step left out (it starts the pipeline): the start-up of engines and torchrun
is not a step, and a burst of noise on a shared machine (seconds when another tenant takes the cores) moves a
median far less than a sum. Each pair gives a ratio; the summary is the median of the pairs' ratios.

It also prints what the cores allow: the CPU seconds (user + system, every process of the run) a training step
costs on each side, from the run's CPU time less that of the same run stopped after its first step. An
overlapped step cannot take less than its CPU seconds over the cores, so the synchronous step time over that
is the most any overlap can gain on this machine.

Usage: python bench/bench_async.py [--repeats 1] [--scenario quickstart|long_generation|all] [override ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from slimecli.net.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
COMMON = ("trainer.nproc=1", "rollout.num_engines=1", "eval.at_start=false", "eval.at_end=false",
          "observe.report=false", "trainer.save_interval=0")
SCENARIOS = {
    "quickstart": (),
    "long_generation": ("rollout.max_new_tokens=64", "trainer.max_steps=20"),
}
SIDES = {"sync": ("trainer.async_rollout=false",), "async": ("trainer.async_rollout=true",)}
LAST = 10


def run_with_cpu(run_dir: Path, overrides: list[str]) -> tuple[list[dict], float]:
    """The run's metrics rows and the CPU seconds its processes used (all of them are waited for)."""
    argv = [sys.executable, "-m", "slimecli", "train", f"run.dir={run_dir}", f"rollout.port={free_port()}", *overrides]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({out.returncode}):\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return rows, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    parser.add_argument("--run-root", type=Path, default=None)
    args, overrides = parser.parse_known_args()
    root = args.run_root or Path(tempfile.mkdtemp(prefix="bench-async-"))
    for scenario in SCENARIOS if args.scenario == "all" else [args.scenario]:
        speed: dict[str, list[float]] = {side: [] for side in SIDES}
        cpu: dict[str, list[float]] = {side: [] for side in SIDES}
        final: dict[str, list[float]] = {side: [] for side in SIDES}
        gaps = []
        for i in range(args.repeats):
            for side in list(SIDES) if i % 2 == 0 else list(SIDES)[::-1]:
                args_ = [*COMMON, *SCENARIOS[scenario], *SIDES[side], *overrides]
                rows, full_cpu = run_with_cpu(root / f"{scenario}-{side}-{i}", args_)
                _, start_cpu = run_with_cpu(root / f"{scenario}-{side}-{i}-start", [*args_, "trainer.max_steps=1"])
                cpu[side].append((full_cpu - start_cpu) / max(len(rows) - 1, 1))
                steps_s = 1.0 / statistics.median(r["time/step_s"] for r in rows[1:])
                reward = statistics.mean(r["reward/mean"] for r in rows[-LAST:])
                speed[side].append(steps_s)
                final[side].append(reward)
                if side == "async":
                    gaps.append(statistics.mean(r.get("rollout/staleness_mean", 0.0) for r in rows[1:]))
                print(f"{scenario} run {i} {side:5s}: {steps_s:.2f} steps/s, final reward {reward:.3f}, "
                      f"{cpu[side][-1]:.3f} CPU s a step", flush=True)
        sync_speed, async_speed = statistics.median(speed["sync"]), statistics.median(speed["async"])
        sync_reward, async_reward = statistics.mean(final["sync"]), statistics.mean(final["async"])
        ratios = [a / s for a, s in zip(speed["async"], speed["sync"], strict=True)]
        goal = " (goal >= 1.4x)" if scenario == "quickstart" else ""
        print(f"\n{scenario}: steps/s async {async_speed:.2f} vs sync {sync_speed:.2f}: ratio "
              f"{statistics.median(ratios):.2f}x{goal} (pairs: {', '.join(f'{r:.2f}' for r in ratios)}); "
              f"final reward async {async_reward:.3f} vs sync "
              f"{sync_reward:.3f} (difference {async_reward - sync_reward:+.3f}, goal within 0.05); "
              f"mean off-policy gap {statistics.mean(gaps):.2f} versions", flush=True)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        floor = statistics.mean(cpu["async"]) / cores  # the shortest overlapped step these cores can run
        print(f"{scenario}: CPU seconds a step: sync {statistics.mean(cpu['sync']):.3f}, async "
              f"{statistics.mean(cpu['async']):.3f}; on {cores} cores an async step takes at least {floor:.3f} s, "
              f"so the most the overlap can gain here is {1 / sync_speed / floor:.2f}x\n", flush=True)


if __name__ == "__main__":
    main()
