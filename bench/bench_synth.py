"""What `slimecli tasks synth` yields and costs on released sdists that ship their tests.

For each project (default: isodate 0.6.1, which needs a venv for `six`, and toolz 1.0.0, which runs on the host),
the sdist is downloaded once into the cache, then `synthesize()` makes up to --max tasks with --jobs workers.
Printed per project: valid tasks, candidates tried, the share kept (valid / tried) and the share that broke
1..K tests, tasks kept per minute, the whole run's time (goal: >= 20 tasks in under 10 minutes on 2 cores), and,
as the baseline measured in the same run, the seconds of one plain `pytest` of the suite at base: the cost of a
task in suite runs. --twice synthesizes again into a second file and says whether the bytes are the same.

    python bench/bench_synth.py [--max 20 --jobs 2 --seed 0 --twice --project isodate==0.6.1 ...]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slimecli.config.groups.sandbox import SandboxConfig  # noqa: E402
from slimecli.config.groups.task import TaskConfig  # noqa: E402
from slimecli.swe.builtin import cache_root  # noqa: E402
from slimecli.swe.synth.pipeline import Options, Report, synthesize  # noqa: E402

PROJECTS = ("isodate==0.6.1", "toolz==1.0.0")


def sdist(requirement: str) -> Path:
    where = cache_root() / "test-sdists"
    name, version = requirement.split("==")
    found = sorted(where.glob(f"{name}-{version}.tar.gz")) + sorted(where.glob(f"{name}-{version}.zip"))
    if found:
        return found[0]
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q",
                    "--disable-pip-version-check", "-d", str(where), requirement], check=True)
    return sorted(where.glob(f"{name}-{version}.*"))[0]


def plain_suite_s(archive: Path, report: Report, envs: Path) -> float:
    """One plain `python -m pytest` of the extracted sdist with the interpreter synthesis used (the baseline)."""
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(archive) as t:
            t.extractall(tmp, filter="data")
        [top] = list(Path(tmp).iterdir())
        pythons = sorted(envs.glob("venv-*/bin/python")) if report.environment.startswith("venv") else []
        python = str(pythons[0]) if pythons else sys.executable
        start = time.monotonic()
        subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="], cwd=top,
                       capture_output=True, env={"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"})
        return time.monotonic() - start


def run(archive: Path, out: Path, repo: Path, options: Options, settings: TaskConfig, name: str) -> Report:
    return asyncio.run(synthesize(archive, out, repo, options, settings, SandboxConfig(),
                                  say=lambda line: print(f"  [{name}] {line}")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", action="append", help="NAME==VERSION of a PyPI sdist with tests (repeatable)")
    parser.add_argument("--max", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--twice", action="store_true", help="synthesize again and compare the files' bytes")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-synth-") as tmp_name:
        tmp = Path(tmp_name)
        envs = tmp / "envs"
        for requirement in args.project or PROJECTS:
            archive = sdist(requirement)
            name = requirement.split("==")[0]
            out = tmp / f"{name}.jsonl"
            options = Options(max_tasks=args.max, seed=args.seed, jobs=args.jobs)
            settings = TaskConfig(name="swe", env_dir=str(envs))
            report = run(archive, out, tmp / f"{name}-repo", options, settings, name)
            same = ""
            if args.twice:
                again = tmp / f"{name}-again.jsonl"
                run(archive, again, tmp / f"{name}-repo", options, settings, name)
                same = "yes" if again.read_bytes() == out.read_bytes() else "NO"
            plain = plain_suite_s(archive, report, envs)
            kept, tried = len(report.rows), max(report.tried, 1)
            per_task = report.elapsed_s / max(kept, 1)
            rows.append((requirement, kept, report.tried, report.candidates, kept / tried, report.broke / tried,
                         kept / (report.elapsed_s / 60), report.elapsed_s, plain, per_task / max(plain, 1e-9), same,
                         dict(report.rejected)))
    print(f"\n{'project':<16} {'kept':>4} {'tried':>5} {'cands':>5} {'kept/tried':>10} {'broke/tried':>11} "
          f"{'tasks/min':>9} {'run s':>7} {'suite s':>7} {'task/suite':>10} {'same bytes':>10}")
    for r in rows:
        print(f"{r[0]:<16} {r[1]:>4} {r[2]:>5} {r[3]:>5} {r[4]:>10.2f} {r[5]:>11.2f} {r[6]:>9.1f} {r[7]:>7.0f} "
              f"{r[8]:>7.1f} {r[9]:>9.1f}x {r[10] or '-':>10}")
        print(f"{'':<16} rejected: {r[11]}")
    print(f"goal: >= {args.max} tasks per project in under 600 s: "
          + ", ".join(f"{r[0]} {'met' if r[1] >= args.max and r[7] < 600 else 'NOT met'}" for r in rows))


if __name__ == "__main__":
    main()
