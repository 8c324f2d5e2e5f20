"""What a task environment costs: a cold build vs a warm lookup, and grading in the sandboxed venv vs plain pytest.

By default the task is a small generated repository that declares one dependency (`six`, in requirements.txt),
so `task.environment=auto` gives it a venv; --tasks FILE --instance ID takes any task instead.
(a) Cold: `resolve()` into an empty cache (venv created, packages installed, runner probed), --builds times;
    warm: `resolve()` again with the venv cached (the key read from git, the manifest found), median of 20.
    Goal: warm <= 0.1 s.
(b) For the gold patch: `grade()` in a sandbox of the chosen kind using the task's venv (everything included),
    and plain `VENV/bin/python -m pytest` with the grader's arguments on a host checkout (gold and test patch
    applied, untimed), repetitions alternating so both see the same load. Goal: <= 1.5x.
(c) Container start vs bwrap start (`/bin/true`), when podman or docker answers here and --image names a local
    image; else says why not.

    python bench/bench_task_env.py [--reps 5 --builds 1 --sandbox auto --tasks FILE --instance ID]
                                   [--image localhost/IMAGE --container-runtime runc]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_swe_grading import host_checkout, plain_pytest  # noqa: E402  (the same host side as that bench)

from slimecli.config.groups.sandbox import SandboxConfig  # noqa: E402
from slimecli.config.groups.task import TaskConfig  # noqa: E402
from slimecli.swe.check import file_diff  # noqa: E402
from slimecli.swe.env.resolve import grader_sandboxes, resolve, store_for  # noqa: E402
from slimecli.swe.grade import grade, test_files  # noqa: E402
from slimecli.swe.task import SweTask, load  # noqa: E402
from slimecli.swe.workspace import run_git  # noqa: E402

SOURCE = "import six\n\n\ndef shout(text):\n    return six.ensure_str(text).upper()\n"
TESTS = "from pkg import shout\n\n\ndef test_shout():\n    assert shout('hi') == 'HI'\n\n\n" \
        "def test_shout_bytes():\n    assert shout(b'ok') == 'OK'\n"


def generated_task(root: Path) -> SweTask:
    """A repository needing `six`, its function broken (lower() for upper()), its tests hidden in the test patch."""
    repo = root / "repo"
    repo.mkdir()
    (repo / "pkg.py").write_text(SOURCE.replace("upper", "lower"))
    (repo / "requirements.txt").write_text("six\n")
    (repo / "pyproject.toml").write_text('[tool.pytest.ini_options]\npythonpath = ["."]\n')
    env = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b"}
    with tempfile.TemporaryDirectory() as home:
        run_git("init", "-q", "-b", "main", ".", cwd=repo, home=home)
        run_git("add", "-A", cwd=repo, home=home)
        run_git("commit", "-q", "-m", "base", cwd=repo, home=home, env=env)
        sha = run_git("rev-parse", "HEAD", cwd=repo, home=home)
    row = {"instance_id": "bench-six", "repo": "bench/pkg", "base_commit": sha, "problem_statement": "shout",
           "patch": file_diff("pkg.py", SOURCE.replace("upper", "lower"), SOURCE),
           "test_patch": file_diff("tests/test_pkg.py", None, TESTS),
           "FAIL_TO_PASS": ["tests/test_pkg.py::test_shout", "tests/test_pkg.py::test_shout_bytes"],
           "PASS_TO_PASS": [], "workdir": str(repo)}
    path = root / "tasks.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return load(str(path)).tasks[0]


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def container_vs_bwrap(reps: int, image: str | None, oci_runtime: str | None) -> None:
    from slimecli.sandbox.bwrap import available
    from slimecli.sandbox.container import runtime_missing
    from slimecli.sandbox.factory import make_sandbox

    runtime = next((r for r in ("podman", "docker") if runtime_missing(r) is None), None)
    why = [f"{r}: {runtime_missing(r)}" for r in ("podman", "docker")] if runtime is None else []
    if image is None:
        why.append("no --image (a local image: there may be no registry to pull from)")
    if runtime is None or image is None or available() is not None:
        print(f"(c) container vs bwrap start: skipped ({'; '.join(why) or available()})")
        return

    def start(kind: str) -> float:
        sandbox = make_sandbox(SandboxConfig(name=kind, container_runtime=oci_runtime), image=image)
        try:
            began = time.perf_counter()
            result = asyncio.run(sandbox.exec(["/bin/true"], 120))
            elapsed = time.perf_counter() - began
        finally:
            sandbox.close()
        if result.returncode != 0:
            raise SystemExit(f"{kind}: /bin/true failed: {result.stderr.strip()[-300:]}")
        return elapsed

    start(runtime)  # the image's layers in the page cache, untimed
    c_times, b_times = [], []
    for _ in range(reps):
        c_times.append(start(runtime))
        b_times.append(start("bwrap"))
    c, b = statistics.median(c_times), statistics.median(b_times)
    print(f"(c) {runtime} start {c:.3f}s  bwrap start {b:.3f}s  ratio {c / b:.1f}x  (image {image})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", help="a task file (default: a generated repository that needs six)")
    ap.add_argument("--instance", help="with --tasks: the instance_id (default: the first task)")
    ap.add_argument("--sandbox", default="auto", help="auto | bwrap | local (sandbox.name)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--builds", type=int, default=1, help="cold builds (each into an empty cache)")
    ap.add_argument("--image", help="(c): a local container image (with /bin/true)")
    ap.add_argument("--container-runtime", help="(c): sandbox.container_runtime, e.g. runc")
    args = ap.parse_args()
    sandbox = SandboxConfig(name=args.sandbox)
    with tempfile.TemporaryDirectory(prefix="slimecli-bench-env-") as tmp_name:
        tmp = Path(tmp_name)
        if args.tasks:
            found = load(args.tasks).tasks
            task = next((t for t in found if args.instance in (None, t.instance_id)), None)
            if task is None:
                raise SystemExit(f"--instance {args.instance}: not in {args.tasks}")
        else:
            task = generated_task(tmp)
        cold_times = []
        for i in range(args.builds):
            settings = TaskConfig(name="swe", env_dir=str(tmp / f"envs-{i}"))
            cold_times.append(timed(lambda s=settings: resolve(task, s, sandbox)))
        env = resolve(task, settings, sandbox)
        if env.kind != "venv":
            raise SystemExit(f"{task.instance_id}: its environment is {env.kind} ({env.why}), not a venv")
        warm = statistics.median(timed(lambda: resolve(task, settings, sandbox)) for _ in range(20))
        cold = statistics.median(cold_times)
        print(f"task {task.instance_id}: {env.kind} {env.key} ({env.why}), "
              f"{store_for(settings).entries()[0].size_bytes / 2**20:.1f} MiB")
        print(f"(a) cold build {cold:.2f}s  warm lookup {warm * 1000:.1f} ms  ratio {cold / warm:.0f}x  "
              f"(goal: warm <= 0.1 s: {'met' if warm <= 0.1 else 'NOT met'})")
        factory = grader_sandboxes(env, sandbox)
        work, files = host_checkout(task, tmp), test_files(task)
        python = Path(env.bin_dir or "") / "python"

        def graded() -> None:
            report = asyncio.run(grade(task, task.patch, sandbox_factory=factory, budget_s=300))
            if not report.resolved:
                raise SystemExit(f"{task.instance_id}: the gold patch did not resolve ({report.error})")

        graded()  # warm: the repository materialised, the page cache filled
        g_times, p_times = [], []
        for _ in range(args.reps):
            g_times.append(timed(graded))
            p_times.append(plain_pytest(work, files, {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, python))
        g, p = statistics.median(g_times), statistics.median(p_times)
        print(f"(b) grading in the sandboxed venv {g:.3f}s  plain pytest in the venv {p:.3f}s  ratio {g / p:.2f}x "
              f"(goal <= 1.50x; sandbox={args.sandbox})")
        shutil.rmtree(work, ignore_errors=True)
    container_vs_bwrap(args.reps, args.image, args.container_runtime)


if __name__ == "__main__":
    main()
