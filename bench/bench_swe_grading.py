"""What grading costs over running the tests: the grader's full path vs plain pytest, side by side.

For every task of a set (default builtin:swe_tiny) and the gold patch: (a) `grade()` in a sandbox of the
chosen kind, everything included (a fresh workspace, sandbox start-up, the apply ladder, restoring the
tests, the test patch, the test run, reading the JUnit report, clean-up); (b) plain `python -m pytest`
with the same arguments on the same test files of a host checkout prepared once (gold and test patch
applied, untimed). Repetitions alternate (a) and (b) so both see the same machine load. Prints median
seconds per task and the ratio (goal: <= 1.5x), and the overall ratio of the summed medians.

    python bench/bench_swe_grading.py [--reps 5 --sandbox local|bwrap --tasks builtin:swe_tiny --fast]

--fast disables pytest plugin autoloading on both sides (this environment's plugins dominate start-up).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slimecli.swe.grade import grade, test_files  # noqa: E402
from slimecli.swe.task import SweTask, load  # noqa: E402
from slimecli.swe.workspace import prepare, run_git  # noqa: E402

FAST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def sandbox_factory(kind: str) -> Callable[[Path], object]:
    """Sandboxes of `kind` as the run's config would make them, whose python is this interpreter."""
    bin_dir = str(Path(sys.executable).parent)
    try:
        from slimecli.sandbox.factory import make_sandbox
    except ImportError:  # a checkout from before the sandbox package: the agent's local sandbox
        if kind not in ("auto", "local"):
            raise SystemExit(f"--sandbox {kind}: this checkout has no sandbox package") from None
        from slimecli.agent.sandbox import LocalSandbox

        return lambda workdir: LocalSandbox(workdir, path_dirs=[bin_dir])
    from slimecli.config.groups.sandbox import SandboxConfig

    settings = SandboxConfig(name=kind)
    ro = tuple(dict.fromkeys((sys.prefix, sys.base_prefix)))
    return lambda workdir: make_sandbox(settings, workdir, path_dirs=(bin_dir,), ro_paths=ro)


def host_checkout(task: SweTask, root: Path) -> Path:
    """Base + gold + test patch, on the host, for the plain pytest side (a directory only this bench made)."""
    work = root / task.instance_id
    work.mkdir()
    prepare(task, work)
    with tempfile.TemporaryDirectory() as home:
        for patch in (task.patch, task.test_patch):
            run_git("apply", "-", cwd=work, input=patch.encode(), home=home)
    return work


def plain_pytest(work: Path, files: list[str], env: dict[str, str], python: str | Path = sys.executable) -> float:
    argv = [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "-q",
            "--continue-on-collection-errors", f"--junitxml={work / '.bench-junit.xml'}", "--", *files]
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{work.name}: plain pytest failed with the gold patch (exit {proc.returncode})")
    return elapsed


def graded(task: SweTask, factory: Callable[[Path], object], test_env: dict[str, str] | None) -> float:
    start = time.perf_counter()
    report = asyncio.run(grade(task, task.patch, sandbox_factory=factory, budget_s=300, test_env=test_env))
    elapsed = time.perf_counter() - start
    if not report.resolved:
        raise SystemExit(f"{task.instance_id}: the gold patch did not resolve ({report.error})")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="builtin:swe_tiny")
    ap.add_argument("--sandbox", default="auto", help="auto | bwrap | local (sandbox.name)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--fast", action="store_true", help="no pytest plugin autoloading, on both sides")
    args = ap.parse_args()
    tasks = load(args.tasks).tasks
    factory = sandbox_factory(args.sandbox)
    test_env = FAST_ENV if args.fast else None
    host_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")} | (test_env or {})
    print(f"{len(tasks)} tasks, {args.reps} repetitions each (alternating), sandbox={args.sandbox}, "
          f"plugins={'off' if args.fast else 'autoloaded'}; median seconds")
    print(f"{'task':<22} {'grader':>8} {'pytest':>8} {'ratio':>7}")
    total_grade = total_plain = 0.0
    with tempfile.TemporaryDirectory(prefix="slimecli-bench-") as tmp:
        for task in tasks:
            work, files = host_checkout(task, Path(tmp)), test_files(task)
            graded(task, factory, test_env)  # warm: the built-in repository is materialised once
            g_times, p_times = [], []
            for _ in range(args.reps):
                g_times.append(graded(task, factory, test_env))
                p_times.append(plain_pytest(work, files, host_env))
            g, p = statistics.median(g_times), statistics.median(p_times)
            total_grade, total_plain = total_grade + g, total_plain + p
            print(f"{task.instance_id:<22} {g:>8.3f} {p:>8.3f} {g / p:>6.2f}x")
    print(f"{'overall':<22} {total_grade:>8.3f} {total_plain:>8.3f} {total_grade / total_plain:>6.2f}x "
          f"(goal <= 1.50x)")


if __name__ == "__main__":
    main()
