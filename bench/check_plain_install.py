"""A plain install grades and runs every command: a fresh venv, a non-editable `pip install .` with no extras from
the package registry, then `slimecli tasks check task.path=builtin:swe_tiny` must pass 20/20, and every command
of tests/helpers/plain_commands.py (what tests/test_plain_install.py runs in CI, there without a download) must
work.

No extra means no pytest in slimecli's interpreter: the built-in (host) tasks get a runner venv that slimecli
builds with pip from the package registry. Installs pin everything with constraints.txt and the CPU torch
(pip's cache makes a second run quick). Exit 0 when 20/20 pass and every command works; prints each step's
seconds.

    python bench/check_plain_install.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TORCH = os.environ.get("TORCH", "torch==2.13.0")  # the Makefile's CPU build


def step(what: str, argv: list[str], **kwargs) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    print(f"{time.perf_counter() - start:7.1f}s  {what} (exit {proc.returncode})", flush=True)
    return proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", help="make the venv and caches here and keep them (default: a temporary directory)")
    args = ap.parse_args()
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="slimecli-plain-"))
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        venv, envs, elsewhere = tmp / "venv", tmp / "envs", tmp / "elsewhere"
        elsewhere.mkdir(exist_ok=True)
        base = os.path.realpath(sys.executable)  # a venv's python links to its base interpreter
        if step("python -m venv", [base, "-m", "venv", str(venv)]).returncode != 0:
            return 2
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        proc = step("pip install . (non-editable, no extras)",
                    [*pip, "-c", str(ROOT / "constraints.txt"), TORCH, str(ROOT)], cwd=elsewhere)
        if proc.returncode != 0:
            print(proc.stderr[-3000:])
            return 2
        probe = step("import pytest (must fail)", [str(venv / "bin" / "python"), "-c", "import pytest"])
        if probe.returncode == 0:
            print("pytest is importable in the plain install: not the case this checks")
            return 2
        check = step("slimecli tasks check task.path=builtin:swe_tiny",
                     [str(venv / "bin" / "slimecli"), "tasks", "check", "task.path=builtin:swe_tiny",
                      f"task.env_dir={envs}"], cwd=elsewhere)
        print(check.stdout.rstrip())
        print(check.stderr.rstrip()[-3000:])
        listed = step("slimecli tasks env list", [str(venv / "bin" / "slimecli"), "tasks", "env", "list",
                                                  f"task.env_dir={envs}"], cwd=elsewhere)
        print(listed.stdout.rstrip())
        ok = check.returncode == 0 and "20/20 tasks valid" in check.stderr
        print("plain install: 20/20 tasks valid" if ok else "plain install: NOT 20/20")
        return 0 if every_command(venv, tmp / "commands") and ok else 1
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


def every_command(venv: Path, work: Path) -> bool:
    """tests/helpers/plain_commands.py's invocations in this venv: each must exit 0 without a traceback."""
    sys.path.insert(0, str(ROOT))
    from tests.helpers.plain_commands import SERVER_EXITS, Workspace, run_all

    failed = []

    def each(result) -> None:  # type: ignore[no-untyped-def]
        ok = result.returncode in (SERVER_EXITS if result.invocation.ready else (0,)) and \
            "Traceback (most recent call last)" not in result.output
        print(f"{result.seconds:7.1f}s  slimecli {' '.join(result.invocation.args)[:100]} (exit {result.returncode})",
              flush=True)
        if not ok:
            failed.append(result)
            print(result.output[-3000:])

    run_all(venv / "bin" / "slimecli", Workspace(work, venv / "bin" / "python"), each=each)
    print("every command works" if not failed else f"{len(failed)} command(s) failed")
    return not failed


if __name__ == "__main__":
    sys.exit(main())
