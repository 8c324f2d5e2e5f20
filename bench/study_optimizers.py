"""The optimizer study of docs/optimizers.md: optimizer=adam against optimizer=stateless_adam, 3 seeds each, on
the quickstart (60 steps of 64 samples) and on a small-batch variant of it (120 steps of 8 samples: every gradient
is noisier, so momentum has something to average).

Runs one `slimecli train` at a time (niced: it uses every core it gets), each in ROOT/<task>/<optimizer>-s<seed>,
seed by seed with both optimizers back to back so that machine load hits both alike; a run directory that already
holds its last step is not run again, so the study resumes where it stopped. Then, per task, the report of its 6
runs grouped by optimizer.name (the 3 seeds as a mean with a ± std band) is rendered into a temporary directory,
its reward, eval, entropy, grad-norm and step-time PNGs are copied to docs/optimizers/<task>/, and a markdown table of the measured numbers is printed and
written to docs/optimizers/<task>/summary.md.

Usage: python bench/study_optimizers.py [--root runs/study] [--seeds 1 2 3] [--tasks quickstart small_batch]
                                        [--out docs/optimizers] [--report-only]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from slimecli.observe.metrics import read_metrics  # noqa: E402
from slimecli.observe.report import write_report  # noqa: E402
from slimecli.observe.runs import group_runs, load_run, summary  # noqa: E402

OPTIMIZERS = ("adam", "stateless_adam")
# name -> (steps, overrides, what it is)
TASKS: dict[str, tuple[int, list[str], str]] = {
    "quickstart": (60, [], "the quickstart as shipped: 8 prompts x 8 samples = 64 a step, one update of 64"),
    "small_batch": (120, ["rollout.batch_size=2", "rollout.n_samples_per_prompt=4", "trainer.global_batch_size=8",
                          "trainer.micro_batch_size=4"],
                    "2 prompts x 4 samples = 8 a step, one update of 8 (a noisier gradient), twice the steps"),
}
THRESHOLD = 0.8
# The plots the doc shows (the others stay 0 on this on-policy loss with one update a step: loss, KL, clip fraction).
PLOTS = ("reward.png", "eval.png", "entropy.png", "grad_norm.png", "time.png")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def done(run_dir: Path, steps: int) -> bool:
    return any(r.get("step") == steps for r in read_metrics(run_dir)) and (run_dir / "final").is_dir()


def train(run_dir: Path, optimizer: str, seed: int, steps: int, overrides: list[str]) -> None:
    argv = [sys.executable, "-m", "slimecli", "train", f"run.dir={run_dir}", f"optimizer={optimizer}",
            f"run.seed={seed}", f"trainer.max_steps={steps}", f"rollout.port={free_port()}",
            f"cluster.master_port={free_port()}", "observe.report=false", *overrides]
    print(f"--- {run_dir.parent.name}/{run_dir.name}: {' '.join(argv[3:])}", flush=True)
    started = time.monotonic()
    log = run_dir.parent / f"{run_dir.name}.console.log"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        code = subprocess.call(argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if code != 0:
        sys.exit(f"{run_dir} failed with exit code {code}; see {log}")
    print(f"    {time.monotonic() - started:.0f}s", flush=True)


def fmt(value: float | None, spec: str = ".3f") -> str:
    return "–" if value is None else format(value, spec)


def median(values: list[float]) -> float | None:
    return sorted(values)[len(values) // 2] if values else None


def checkpoint_mb(run_dir: Path) -> float | None:
    """Size of the run's last checkpoint (model + optimizer state + the rest), in MB."""
    ckpts = sorted((run_dir / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    return sum(f.stat().st_size for f in ckpts[-1].iterdir() if f.is_file()) / 1e6 if ckpts else None


def table(task: str, run_dirs: list[Path]) -> str:
    groups = group_runs([load_run(p) for p in run_dirs], by=["optimizer.name"])
    lines = [f"| {task} | final reward (last 10% of steps) | first step with reward ≥ {THRESHOLD} | "
             "held-out reward, start → end | step time (s) | update time (s) | checkpoint (MB) |",
             "|---|---|---|---|---|---|---|"]
    for g in groups:
        s = summary(g.runs, threshold=THRESHOLD)
        per_seed = [summary([r], threshold=THRESHOLD) for r in g.runs]
        finals = ", ".join(fmt(p["final_reward"]) for p in per_seed)
        hits = ", ".join(fmt(p["steps_to_threshold"], ".0f") if p["steps_to_threshold"] is not None else "never"
                         for p in per_seed)
        reached = fmt(s["steps_to_threshold"], ".1f") if s["steps_to_threshold"] is not None else (
            f"{s['reached_threshold']} of {s['runs']} reach it")
        updates = [median(r.series("time/update_s")[1]) for r in g.runs]
        update_s = [u for u in updates if u is not None]
        sizes = [m for m in (checkpoint_mb(r.path) for r in g.runs) if m is not None]
        lines.append(f"| {g.display} | {fmt(s['final_reward'])} ({finals}) | {reached} ({hits}) | "
                     f"{fmt(s['eval_start'])} → {fmt(s['eval_end'])} | {fmt(s['step_time_s'], '.2f')} | "
                     f"{fmt(sum(update_s) / len(update_s) if update_s else None, '.3f')} | "
                     f"{fmt(sum(sizes) / len(sizes) if sizes else None, '.2f')} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=ROOT / "runs" / "study")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=list(TASKS))
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "optimizers")
    ap.add_argument("--report-only", action="store_true", help="render the runs that exist, start none")
    args = ap.parse_args()
    os.nice(10)  # the children inherit it
    for task in args.tasks:
        steps, overrides, _ = TASKS[task]
        for seed in args.seeds:  # seeds outside, optimizers inside: machine noise hits both alike
            for optimizer in OPTIMIZERS:
                run_dir = (args.root / task / f"{optimizer}-s{seed}").resolve()
                if not args.report_only and not done(run_dir, steps):
                    train(run_dir, optimizer, seed, steps, overrides)
    for task in args.tasks:
        run_dirs = [(args.root / task / f"{o}-s{s}").resolve() for o in OPTIMIZERS for s in args.seeds]
        run_dirs = [p for p in run_dirs if read_metrics(p)]
        if not run_dirs:
            continue
        out = args.out / task
        with tempfile.TemporaryDirectory() as tmp:
            write_report(run_dirs, Path(tmp), title=f"adam vs stateless_adam: {task}", by=["optimizer.name"])
            out.mkdir(parents=True, exist_ok=True)
            for old in out.glob("*.png"):
                old.unlink()
            for name in PLOTS:
                if (Path(tmp) / name).is_file():
                    shutil.copy(Path(tmp) / name, out / name)
        text = table(task, run_dirs)
        steps, _, what = TASKS[task]
        (out / "summary.md").write_text(f"{what}; {steps} steps, seeds {args.seeds}\n\n{text}\n")
        print(f"\n{task}: {what}\n{text}\nplots: {out}", flush=True)


if __name__ == "__main__":
    main()
