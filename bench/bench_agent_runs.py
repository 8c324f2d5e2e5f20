"""Agent runs per minute on the smoke recipe at several concurrencies, and where a run's time goes.

Each run is what a training step does for one task: a fresh workspace and sandbox, the real CLI (Claude Code
by default) driven through the adapter by the embedded engine with the tiny model (agent.constrain=choices,
as in +recipe=swe_agent_smoke), the diff captured and graded by the task's tests. For each concurrency the
same --runs runs (builtin:swe_tiny_smoke tasks in order) go through run_task, at most that many at a time;
concurrency 1 is the baseline. Prints runs/min, the speed-up over the baseline, and the mean seconds per run
in making the sandbox, the engine (every turn's /generate), the CLI and its tools (the rest of the CLI's wall
time) and grading.

    python bench/bench_agent_runs.py [--concurrency 1 4 8 --runs 8 --agent claude_code]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slimecli.agent.api.service import AgentService  # noqa: E402
from slimecli.agent.harness.jobs import SweJob  # noqa: E402
from slimecli.agent.harness.task import run_task  # noqa: E402
from slimecli.agent.training.collector import time_split  # noqa: E402
from slimecli.config.compose import load  # noqa: E402
from slimecli.rollout.sample import Sample  # noqa: E402
from slimecli.sandbox.factory import grader_factory  # noqa: E402
from slimecli.swe.task import load as load_tasks  # noqa: E402


async def batch(service: AgentService, tasks: list, concurrency: int) -> tuple[float, list[list[Sample]]]:
    cfg = service.cfg
    limit = asyncio.Semaphore(concurrency)

    async def one(i: int) -> list[Sample]:
        task = tasks[i % len(tasks)]
        job = SweJob(task, grade_sandbox=grader_factory(cfg.sandbox), eval_budget_s=cfg.agent.eval_budget_s)
        async with limit:
            return await run_task(service, job, base_sample=Sample(prompt=task.problem_statement, index=i))

    start = time.perf_counter()
    runs = await asyncio.gather(*(one(i) for i in range(len(tasks))))
    return time.perf_counter() - start, list(runs)


async def main_async(args: argparse.Namespace) -> int:
    cfg = load(["+recipe=swe_agent_smoke", f"agent={args.agent}", f"agent.concurrency={max(args.concurrency)}"],
               uses_agent=True)
    every = load_tasks(str(cfg.task.path)).tasks
    tasks = [every[i % len(every)] for i in range(args.runs)]
    service = AgentService(cfg, port=0)
    await service.start()
    rows = []
    kinds: set[str] = set()  # the sandbox kind `auto` resolved to
    try:
        await batch(service, tasks[:1], 1)  # warm-up: node's module cache, the engine's first compile
        for c in args.concurrency:
            wall, runs = await batch(service, tasks, c)
            aborted = sum(any(s.metadata.get("abort_reason") for s in run) for run in runs)
            resolved = statistics.mean(float(run[0].reward.get("resolved", 0)) if isinstance(run[0].reward, dict)
                                       else 0.0 for run in runs)
            rows.append((c, wall, len(runs) / wall * 60, time_split(runs), aborted, resolved))
            kinds.update(str(s.metadata.get("sandbox")) for run in runs for s in run)
    finally:
        await service.stop()
    print(f"{args.runs} agent runs of +recipe=swe_agent_smoke ({args.agent}, sandbox={'/'.join(sorted(kinds))}), tiny model")
    print(f"{'concurrency':>11} {'wall s':>8} {'runs/min':>9} {'speed-up':>9}   mean s per run: "
          f"{'sandbox':>8} {'engine':>8} {'cli':>8} {'grade':>8}   aborted resolved")
    base = rows[0][2]
    for c, wall, rate, split, aborted, resolved in rows:
        parts = [split.get(f"agent/time/{k}_s", 0.0) for k in ("sandbox", "engine", "cli", "grade")]
        print(f"{c:>11} {wall:>8.1f} {rate:>9.2f} {rate / base:>8.2f}x   {'':>15}" +
              "".join(f"{p:>9.2f}" for p in parts) + f"   {aborted:>7} {resolved:>8.2f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--agent", default="claude_code", choices=["claude_code", "codex"])
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
