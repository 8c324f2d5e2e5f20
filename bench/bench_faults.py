"""An engine killed mid-run against the same seed's uninterrupted run, side by side.

Runs the quickstart (`slimecli train`, default settings but trainer.max_steps and one trainer rank) twice: once
untouched, once with `kill -9` of engine-0 once step --kill-at is logged. The killed run must complete every step
with no command from the user, its metrics must count one restart, and its final reward must be within 0.05 of the
untouched run's (goal). Prints both runs' rewards, the difference, and the wall time the restart cost.

    python bench/bench_faults.py [--steps 10] [--kill-at 3] [--backend local|sglang]

--backend sglang runs rollout=sglang's argv path with the stand-in server of the tests (slimecli's engine behind
`python -m sglang.launch_server`), as no GPU is needed for it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "helpers" / "sglang_standin"


def rows(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def engine_pid(controller: int, marker: bytes) -> int | None:
    """The engine process under the controller: the pid whose command line holds ``marker``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if marker in cmdline and int(stat.rsplit(")", 1)[1].split()[1]) == controller:
            return int(entry.name)
    return None


def train(run: Path, steps: int, backend: str, kill_at: int | None) -> tuple[float, int]:
    """One run; (wall seconds, exit code)."""
    argv = [sys.executable, "-m", "slimecli", "train", f"run.dir={run}", "observe.report=false", "trainer.nproc=1",
            f"trainer.max_steps={steps}"]
    env = dict(os.environ)
    marker = b"-m\x00slimecli.engine"
    if backend == "sglang":
        argv.append("rollout=sglang")
        env["PYTHONPATH"] = os.pathsep.join([str(STANDIN), env.get("PYTHONPATH", "")])
        marker = b"rollout\x00serve"
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        if kill_at is not None:
            while proc.poll() is None and len(rows(run)) < kill_at:
                time.sleep(0.2)
            pid = engine_pid(proc.pid, marker)
            if pid is None:
                raise SystemExit("no engine process found to kill")
            os.kill(pid, signal.SIGKILL)
        code = proc.wait(timeout=1800)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return time.perf_counter() - started, code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--kill-at", type=int, default=3)
    parser.add_argument("--backend", choices=("local", "sglang"), default="local")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
        plain, killed = Path(tmp) / "plain", Path(tmp) / "killed"
        plain_s, plain_code = train(plain, args.steps, args.backend, None)
        killed_s, killed_code = train(killed, args.steps, args.backend, args.kill_at)
        a, b = rows(plain), rows(killed)
        print(f"backend={args.backend}, {args.steps} steps, engine killed once step {args.kill_at} was logged")
        print(f"  untouched: exit {plain_code}, {len(a)} steps, {plain_s:.1f}s, rewards "
              f"{[round(r['reward/mean'], 4) for r in a]}")
        print(f"  killed:    exit {killed_code}, {len(b)} steps, {killed_s:.1f}s, rewards "
              f"{[round(r['reward/mean'], 4) for r in b]}")
        steps_ok = [r["step"] for r in b] == list(range(1, args.steps + 1))
        restarts = b[-1].get("run/server_restarts") if b else None
        diff = abs(a[-1]["reward/mean"] - b[-1]["reward/mean"]) if a and b else float("inf")
        print(f"  every step once: {steps_ok}; restarts counted: {restarts}; final reward difference {diff:.4f} "
              f"(goal <= 0.05); the restart cost {killed_s - plain_s:+.1f}s ({killed_s / plain_s:.2f}x)")
        ok = plain_code == 0 and killed_code == 0 and steps_ok and restarts == 1 and diff <= 0.05
        print("goal met" if ok else "goal NOT met")
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
