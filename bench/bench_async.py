"""Rollouts generated ahead of the trainer (trainer.async_rollout) against the synchronous step, side by side.

Each round runs the same `slimecli train` once per side in fresh run directories (--repeats K rounds, the order
of the sides rotating, so machine noise hits every side). The scenarios, all on 1 trainer rank and 1 engine:

- quickstart: the embedded quickstart as shipped (short answers: the rollout and the training step cost
  about the same); synchronous against one step ahead;
- long_generation: the same task with 64-token answers, where generation dominates the step;
- long_tail: 1 prompt in 8 sampled with 8x max_new_tokens and ignore_eos (bench/long_tail.py), the shape of
  reasoning and agent rollouts, micro-batched by padded tokens (trainer.max_tokens_per_micro_batch); synchronous,
  one step ahead, and max_staleness N = 2, 4 and 8 with partial rollouts. Goal: at N = 4, at least 1.5x the
  one-step speed or at least 90% of the cores' bound, with the final reward within 0.02 of synchronous;
- eval: one step ahead without evaluations and with the held-out evaluation after every step
  (eval.interval=1), which runs beside training pinned to its weights. Goal: step time within 10%.

Per side: steps per second of the training loop (one over the median time from a step's row in metrics.jsonl to the
next, the first step left out: it starts the pipeline; time/step_s leaves out the step's records), the engine's
idle share (1 - its busy seconds, from the stats it logs when it stops, over the training loop's wall time), the
trainer's idle share (its rollout stage, the time it waited for a rollout, over its step time), the final reward
(mean reward/mean of the last 10 steps) and the staleness the side trained with.

The cores' bound: the CPU seconds (user + system, every process of the run) a training step costs, from the
run's CPU time less that of the same run stopped after its first step. No overlap can run a step in less than
its CPU seconds over the cores, so the synchronous step time over that is the most any overlap can gain here.

Usage: python bench/bench_async.py [--repeats 1] [--scenario quickstart|long_generation|long_tail|all]
       [override ...]
"""

from __future__ import annotations

import argparse
import itertools
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
# micro-batched by padded tokens, as a long-tail run is (docs/training.md): 32 samples a micro-batch pad every short
# sample beside a long one to its length, and the update costs about twice as much
LONG_TAIL = (f"rollout.generate={ROOT / 'bench' / 'long_tail.py'}:collector", "trainer.max_steps=80",
             "trainer.max_tokens_per_micro_batch=1024")
AHEAD = ("trainer.async_rollout=true", "trainer.partial_rollouts=true")
SCENARIOS: dict[str, tuple[tuple[str, ...], dict[str, tuple[str, ...]]]] = {
    "quickstart": ((), {"sync": (), "one_step": ("trainer.async_rollout=true",)}),
    "long_generation": (("rollout.max_new_tokens=64", "trainer.max_steps=20"),
                        {"sync": (), "one_step": ("trainer.async_rollout=true",)}),
    "long_tail": (LONG_TAIL, {"sync": (), "one_step": ("trainer.async_rollout=true",),
                              "N=2": (*AHEAD, "trainer.max_staleness=2"), "N=4": (*AHEAD, "trainer.max_staleness=4"),
                              "N=8": (*AHEAD, "trainer.max_staleness=8")}),
    "eval": (("trainer.async_rollout=true",), {"no_eval": (), "eval_1": ("eval.interval=1",)}),
}
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


def engine_busy_s(run_dir: Path) -> float:
    """The seconds the engine computed (prefill, decode, extend, sampling, grammar), from its last stats line."""
    lines = [line for line in (run_dir / "logs" / "engine-0.log").read_text().splitlines() if "engine stats: " in line]
    if not lines:
        return float("nan")
    stats = json.loads(lines[-1].split("engine stats: ", 1)[1])
    return sum(float(stats.get(k, 0.0)) for k in ("prefill_s", "decode_s", "extend_s", "sample_s", "grammar_s"))


def measure(scenario: str, args: argparse.Namespace, overrides: list[str], root: Path) -> None:
    base, sides = SCENARIOS[scenario]
    names = list(sides)
    out: dict[str, dict[str, list[float]]] = {name: {} for name in names}

    def note(side: str, key: str, value: float) -> None:
        out[side].setdefault(key, []).append(value)

    for i in range(args.repeats):
        for side in names[i % len(names):] + names[:i % len(names)]:
            argv = [*COMMON, *base, *sides[side], *overrides]
            run = root / f"{scenario}-{side.replace('=', '')}-{i}"
            rows, full_cpu = run_with_cpu(run, argv)
            _, start_cpu = run_with_cpu(root / f"{run.name}-start", [*argv, "trainer.max_steps=1"])
            steps = rows[1:]
            wall = sum(r["time/step_s"] for r in steps)
            # the time from one step's row to the next: the step and what the loop does between steps (its records)
            between = [b["time"] - a["time"] for a, b in itertools.pairwise(steps)]
            note(side, "steps_s", 1.0 / statistics.median(between))
            note(side, "cpu", (full_cpu - start_cpu) / max(len(steps), 1))
            note(side, "reward", statistics.mean(r["reward/mean"] for r in rows[-LAST:]))
            note(side, "engine_idle", max(0.0, 1.0 - engine_busy_s(run) / sum(r["time/step_s"] for r in rows)))
            note(side, "trainer_idle", sum(r["time/rollout_s"] for r in steps) / wall)
            note(side, "staleness", statistics.mean(r.get("rollout/staleness_mean", 0.0) for r in steps))
            print(f"{scenario} run {i} {side:8s}: {out[side]['steps_s'][-1]:.2f} steps/s, final reward "
                  f"{out[side]['reward'][-1]:.3f}, engine idle {out[side]['engine_idle'][-1]:.0%}, trainer idle "
                  f"{out[side]['trainer_idle'][-1]:.0%}, {out[side]['cpu'][-1]:.3f} CPU s a step", flush=True)
    med = {side: {k: statistics.median(v) for k, v in values.items()} for side, values in out.items()}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    first = med[names[0]]  # the baseline side: sync, or no_eval
    one = med.get("one_step", first)
    print(f"\n{scenario} (median of {args.repeats} round(s), {cores} cores):")
    print(f"  {'side':8s} {'steps/s':>8s} {'vs one-step':>11s} {'vs bound':>9s} {'engine idle':>11s} "
          f"{'trainer idle':>12s} {'reward':>7s} {'vs ' + names[0]:>11s} {'staleness':>9s}")
    for side in names:
        m = med[side]
        bound = cores / m["cpu"]  # the steps/s these cores allow at this side's CPU cost per step
        print(f"  {side:8s} {m['steps_s']:8.2f} {m['steps_s'] / one['steps_s']:10.2f}x {m['steps_s'] / bound:8.0%} "
              f"{m['engine_idle']:11.0%} {m['trainer_idle']:12.0%} {m['reward']:7.3f} "
              f"{m['reward'] - first['reward']:+11.3f} {m['staleness']:9.2f}")
    if "sync" in med:
        most = cores / statistics.mean(med[s]["cpu"] for s in names if s != "sync")
        print(f"  the cores' bound: an overlapped step costs at least {1 / most:.3f} s here, so the most any "
              f"overlap can gain over synchronous is {most / first['steps_s']:.2f}x", flush=True)
    if "eval_1" in med:
        ratio = med["no_eval"]["steps_s"] / med["eval_1"]["steps_s"]
        floor = med["no_eval"]["steps_s"] * med["eval_1"]["cpu"] / cores  # the evaluation's CPU on these cores
        print(f"  step time with an evaluation after every step: {ratio:.2f}x the step without (goal <= 1.10x); "
              f"its CPU seconds allow no less than {floor:.2f}x on {cores} cores\n", flush=True)
    if "N=4" in med:
        n4 = med["N=4"]
        speedup, of_bound = n4["steps_s"] / one["steps_s"], n4["steps_s"] / (cores / n4["cpu"])
        print(f"  goal at N=4: {speedup:.2f}x one-step (>= 1.5x) or {of_bound:.0%} of the cores' bound (>= 90%), "
              f"final reward {n4['reward'] - first['reward']:+.3f} from synchronous (within 0.02)\n", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    parser.add_argument("--run-root", type=Path, default=None)
    args, overrides = parser.parse_known_args()
    root = args.run_root or Path(tempfile.mkdtemp(prefix="bench-async-"))
    for scenario in SCENARIOS if args.scenario == "all" else [args.scenario]:
        measure(scenario, args, overrides, root)


if __name__ == "__main__":
    main()
