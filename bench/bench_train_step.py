"""Where a quickstart training step spends its time: per-stage shares of `slimecli train`.

Runs the real quickstart (2 trainer ranks, 1 engine, on CPU) for a few steps, then reads the run's
metrics.jsonl: the mean over steps (the first is warm-up and left out; means, unlike medians, add up) of
time/step_s and of every stage's time/<stage>_s (rollout, old_logp, ref_logp, advantages, update,
sync_weights, save), with each stage's share of the step. The stages plus the metrics bookkeeping make
up the step; save runs after time/step_s is taken (and only on the last step here), so it is outside it.

--baseline RUN reads another run's metrics.jsonl (say, one made by an older checkout, which only logs
time/step_s, time/rollout_s and time/train_s) and prints its step time beside this one.

--baseline-ref [GITREF] measures side by side: it exports GITREF of this repository (`git archive`, into a
temporary directory) and runs the quickstart from there with the same Python interpreter (cwd and PYTHONPATH
set to that export, so `-m slimecli` and every process it starts import the old code, not this checkout's
editable install; the imported slimecli file is checked and printed first), interleaved with this checkout's
working tree: baseline, current, baseline, current, ... (--repeats K pairs, default 2), so that machine noise
hits both sides. Each run has its own run directory. It prints each run's mean steady-state time/step_s, each
side's mean and the ratio current / baseline, then the per-stage table of the current side.
GITREF is any commit-ish. Without a value it is the last commit before the trainer was reworked into named
stages: the parent of the first commit that added slimecli/train/stages.py
(`git log --diff-filter=A --format=%H -- slimecli/train/stages.py | tail -1`, then `^`).
The bench itself passes only overrides the old version accepts too (run.dir, trainer.max_steps,
trainer.save_interval); extra overrides on the command line go to both sides.

Usage: python bench/bench_train_step.py [--steps 10] [--baseline RUN_DIR] [--run-dir DIR] [override ...]
       python bench/bench_train_step.py [--steps 10] [--repeats 2] --baseline-ref[=GITREF] [override ...]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("rollout", "old_logp", "ref_logp", "advantages", "update", "sync_weights", "eval", "save")
STAGES_FILE = "slimecli/train/stages.py"
DEFAULT_REF = "<before stages>"  # --baseline-ref without a value: the parent of the commit that added STAGES_FILE


def git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} failed: {out.stderr.strip()}")
    return out.stdout.strip()


def resolve_ref(ref: str) -> tuple[str, str]:
    """(commit, description) for a --baseline-ref value; DEFAULT_REF: the last commit before the staged trainer."""
    if ref == DEFAULT_REF:
        added = git("log", "--diff-filter=A", "--format=%H", "--", STAGES_FILE).splitlines()
        if not added:
            raise SystemExit(f"no commit adds {STAGES_FILE}; give --baseline-ref=GITREF")
        ref = f"{added[-1][:10]}^"
    commit = git("rev-parse", "--verify", "--end-of-options", f"{ref}^{{commit}}")
    return commit, f"{ref} = {commit[:10]} {git('log', '-1', '--format=%s', commit)[:70]}"


def export_ref(commit: str, dest: Path) -> Path:
    """The tree of `commit` (git archive) unpacked into dest; the repository and its work tree are untouched."""
    tar = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, check=True)
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as archive:
        archive.extractall(dest, filter="data")
    return dest


def checkout_env(checkout: Path) -> dict[str, str]:
    """This environment with `checkout` first on PYTHONPATH, ahead of any editable install in the venv."""
    path = os.pathsep.join(p for p in (str(checkout), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def check_imports(checkout: Path) -> str:
    """The slimecli/__init__.py that `-m slimecli` imports when run from `checkout`; it must be that checkout's."""
    probe = [sys.executable, "-c", "import slimecli; print(slimecli.__file__)"]
    out = subprocess.run(probe, cwd=checkout, env=checkout_env(checkout), capture_output=True, text=True)
    found = Path(out.stdout.strip()).resolve() if out.returncode == 0 else None
    if found != (checkout / "slimecli" / "__init__.py").resolve():
        raise SystemExit(f"from {checkout}, `import slimecli` gives {found or out.stderr.strip()}, not its own")
    return str(found)


def run_quickstart(run_dir: Path, steps: int, overrides: list[str], checkout: Path = ROOT) -> None:
    argv = [
        sys.executable,
        "-m",
        "slimecli",
        "train",
        f"run.dir={run_dir}",
        f"trainer.max_steps={steps}",
        "trainer.save_interval=0",
        *overrides,
    ]
    out = subprocess.run(argv, cwd=checkout, env=checkout_env(checkout), capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"slimecli train failed ({out.returncode}):\n{out.stdout[-3000:]}{out.stderr[-3000:]}")


def means(run_dir: Path) -> dict[str, float]:
    rows = [row for line in (run_dir / "metrics.jsonl").read_text().splitlines() if (row := json.loads(line))["step"]]
    steady = rows[1:] if len(rows) > 1 else rows  # step 1 pays for warm-up (row 0: the evaluation at start)
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


def side_by_side(ref: str, steps: int, repeats: int, overrides: list[str]) -> None:
    commit, described = resolve_ref(ref)
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        old_tree = export_ref(commit, Path(tmp) / "baseline-src")
        print(f"baseline: {described}\n  imports {check_imports(old_tree)}")
        print(f"current:  working tree\n  imports {check_imports(ROOT)}")
        sides: dict[str, list[dict[str, float]]] = {"baseline": [], "current": []}
        for i in range(repeats):
            for side, checkout in (("baseline", old_tree), ("current", ROOT)):
                run_dir = Path(tmp) / f"{side}-{i + 1}"
                run_quickstart(run_dir, steps, overrides, checkout)
                sides[side].append(means(run_dir))
                print(f"  {side:<8} run {i + 1}: step {sides[side][-1]['time/step_s'] * 1000:8.1f} ms", flush=True)
    mean = {side: statistics.fmean(run["time/step_s"] for run in runs) for side, runs in sides.items()}
    print(f"baseline step (mean of {repeats}): {mean['baseline'] * 1000:8.1f} ms")
    print(f"current  step (mean of {repeats}): {mean['current'] * 1000:8.1f} ms")
    print(f"current / baseline = {mean['current'] / mean['baseline']:.3f}")
    current = {k: statistics.fmean(run[k] for run in sides["current"] if k in run) for k in sides["current"][0]}
    report(current, None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--run-dir", type=Path, help="where to run (default: a temporary directory)")
    parser.add_argument("--baseline", type=Path, help="a run directory to compare step times with")
    parser.add_argument(
        "--baseline-ref",
        nargs="?",
        const=DEFAULT_REF,
        metavar="GITREF",
        help="run GITREF's quickstart interleaved with this one (default: before the stage rework)",
    )
    parser.add_argument("--repeats", type=int, default=2, help="with --baseline-ref: baseline/current pairs")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for slimecli train")
    args = parser.parse_args()
    if args.steps < 2 or args.repeats < 1:
        parser.error("--steps must be at least 2 (step 1 is warm-up) and --repeats at least 1")
    if args.baseline_ref is not None:
        if args.baseline is not None or args.run_dir is not None:
            parser.error("--baseline-ref runs both sides itself; it does not take --baseline or --run-dir")
        side_by_side(args.baseline_ref, args.steps, args.repeats, args.overrides)
        return 0
    baseline = means(args.baseline) if args.baseline is not None else None
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        run_dir = args.run_dir or Path(tmp) / "run"
        run_quickstart(run_dir, args.steps, args.overrides)
        report(means(run_dir), baseline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
