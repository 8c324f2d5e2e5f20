"""Start-up: how long a command takes to do its first piece of work, and the CPU it burns until then.

Three commands, each run from this working tree and from --baseline-ref side by side, interleaved (baseline,
current, baseline, current, ... --repeats pairs), so that machine noise hits both sides:

- `slimecli train trainer.max_steps=1`: from the command to the first step's line (`train step 1/1`), and the
  CPU-seconds of the whole process tree (controller, engine, trainer ranks, ...) until that line;
- `slimecli eval model.path=<the tiny model>`: the command to its end (its one evaluation is its work);
- `slimecli agent run` with a scripted stand-in for the Claude Code CLI (one Messages request): the command to
  its end.

CPU-seconds at a line are read from /proc: user + system time of every live process in the tree, plus what each
has collected from children it reaped; at the end, from the command's own rusage (wait4). The goal (issue 44):
the current side at most half the baseline's CPU-seconds and half its time to the first step.

--baseline-ref is any commit-ish, by default the commit the start-up work began from; it is exported (`git
archive`) into a temporary directory and run with the same interpreter, that export first on PYTHONPATH (the
imported slimecli file is checked and printed). --breakdown prints, for the current side's first train run, the
CPU-seconds of each process at the first step's line.

    python bench/bench_startup.py [--repeats 2] [--baseline-ref GITREF] [--only train eval agent] [--breakdown]
                                  [--template 1|0]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_train_step import ROOT, check_imports, checkout_env, export_ref, git

from tests.helpers.scripted_claude import scripted_claude

BASELINE_REF = "d3b0cd85753aaa0882368adf5f44b363cd2fe1c5"  # main when the start-up work began
TICK = os.sysconf("SC_CLK_TCK")
FIRST_STEP = re.compile(r"train step 1/")


@dataclass
class Case:
    name: str
    args: Callable[[Path], list[str]]  # the command's arguments after `slimecli`, given a fresh directory
    marker: re.Pattern[str] | None  # the line that ends the measurement; None: the command's end


@dataclass
class Measured:
    seconds: float  # the command's start to the marker (or its end)
    cpu_s: float  # CPU-seconds of its process tree until then
    total_s: float  # the whole command
    per_process: dict[str, float] = field(default_factory=dict)


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU-seconds of the process and of the children it reaped)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), sum(int(v) for v in fields[11:15]) / TICK


def tree_cpu(root: int) -> dict[int, float]:
    """CPU-seconds of `root` and every live descendant, by pid."""
    parents: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            got = _stat(int(entry))
            if got is not None:
                parents.setdefault(got[0], []).append(int(entry))
                cpu[int(entry)] = got[1]
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in cpu:
            out[pid] = cpu[pid]
        todo.extend(parents.get(pid, []))
    return out


def label(pid: int) -> str:
    """A short name of a process from its command line."""
    from slimecli.process import command_line

    argv = command_line(pid)  # a template-forked process's one-string title, split
    if not argv:
        return str(pid)
    modules = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-m"]
    if modules:
        return " ".join(modules)
    return " ".join(Path(a).name for a in argv[:3] if a)


def measure(argv: list[str], cwd: Path, env: dict[str, str], marker: re.Pattern[str] | None,
            timeout_s: float = 900.0) -> Measured:
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    hit: tuple[float, float, dict[str, float]] | None = None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        if hit is None and marker is not None and marker.search(line):
            cpu = tree_cpu(proc.pid)
            names: dict[str, float] = {}
            for pid, seconds in cpu.items():
                names[label(pid)] = names.get(label(pid), 0.0) + seconds
            hit = (time.perf_counter() - start, sum(cpu.values()), names)
        if time.perf_counter() - start > timeout_s:
            proc.kill()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    total_s = time.perf_counter() - start
    total_cpu = usage.ru_utime + usage.ru_stime  # the command and every descendant reaped below it
    if proc.returncode != 0 or (marker is not None and hit is None):
        raise SystemExit(f"{' '.join(argv[2:])} failed (exit {proc.returncode}"
                         f"{'' if hit or marker is None else ', no ' + marker.pattern + ' line'}):\n"
                         + "".join(lines[-40:]))
    if hit is None:
        return Measured(total_s, total_cpu, total_s)
    return Measured(hit[0], hit[1], total_s, hit[2])


def cases(tmp: Path) -> list[Case]:
    fake = tmp / "fake-claude"
    fake.write_text(scripted_claude(sys.executable))
    fake.chmod(0o755)
    return [
        Case("train", lambda d: ["train", "trainer.max_steps=1", f"run.dir={d / 'run'}"], FIRST_STEP),
        Case("eval", lambda d: ["eval", f"run.root={d}"], None),
        Case("agent", lambda d: ["agent", "run", "agent=claude_code", f"agent.binary={fake}", "sandbox=local",
                                 "task.prompt=Say hello.", f"agent.output={d / 'samples.jsonl'}"], None),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-ref", default=BASELINE_REF, metavar="GITREF")
    parser.add_argument("--repeats", type=int, default=2, help="baseline/current pairs per command")
    parser.add_argument("--only", nargs="+", choices=("train", "eval", "agent"), default=("train", "eval", "agent"))
    parser.add_argument("--breakdown", action="store_true", help="CPU-seconds per process at the first step")
    parser.add_argument("--template", choices=("1", "0"), default="1",
                        help="SLIMECLI_TEMPLATE for both sides (the run's template, launch/template.py; the "
                             "baseline predates it and ignores it)")
    args = parser.parse_args()
    commit = git("rev-parse", "--verify", "--end-of-options", f"{args.baseline_ref}^{{commit}}")
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as name:
        tmp = Path(name)
        old = export_ref(commit, tmp / "baseline-src")
        print(f"baseline: {commit[:10]} {git('log', '-1', '--format=%s', commit)[:70]}\n  imports {check_imports(old)}")
        print(f"current:  working tree\n  imports {check_imports(ROOT)}", flush=True)
        sides = {"baseline": old, "current": ROOT}
        for case in [c for c in cases(tmp) if c.name in args.only]:
            got: dict[str, list[Measured]] = {side: [] for side in sides}
            for i in range(args.repeats):
                for side, checkout in sides.items():
                    work = tmp / f"{case.name}-{side}-{i}"
                    work.mkdir()
                    argv = [sys.executable, "-m", "slimecli", *case.args(work)]
                    env = {**checkout_env(checkout), "SLIMECLI_TEMPLATE": args.template}
                    m = measure(argv, work, env, case.marker)
                    got[side].append(m)
                    print(f"  {case.name:<6} {side:<8} {i + 1}: {m.seconds:6.2f} s, {m.cpu_s:6.2f} CPU-s "
                          f"(command {m.total_s:.2f} s)", flush=True)
                    if args.breakdown and side == "current" and i == 0 and m.per_process:
                        for proc, seconds in sorted(m.per_process.items(), key=lambda kv: -kv[1]):
                            print(f"      {seconds:6.2f} CPU-s  {proc}")
            what = "to the first step" if case.marker is not None else "to the end"
            base, cur = (statistics.median(m.seconds for m in got[s]) for s in sides)
            base_cpu, cur_cpu = (statistics.median(m.cpu_s for m in got[s]) for s in sides)
            print(f"{case.name}: {what}: {cur:.2f} s vs {base:.2f} s (current/baseline {cur / base:.2f}); "
                  f"CPU {cur_cpu:.2f} vs {base_cpu:.2f} CPU-s ({cur_cpu / base_cpu:.2f}); goal <= 0.5 for both",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
