"""Where each process's start-up went (`slimecli train --profile-startup`).

With SLIMECLI_PROFILE_STARTUP=1 in its environment, each process the controller starts (engine, trainer ranks,
teacher ranks, evaluator) appends one JSON line per phase it reaches (imports done, model loaded, ready, first
step) to RUN/logs/startup.jsonl: when (wall clock), its own CPU-seconds until then and when the process began (the
kernel's start time, so the interpreter's own start counts). The controller reads the file and prints a table.
Without the variable, mark() returns at once. Standard library only: importing it must not cost what it measures.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STARTUP_ENV = "SLIMECLI_PROFILE_STARTUP"
STARTUP_FILE = "startup.jsonl"  # in RUN/logs/
PHASES = ("imported", "model loaded", "ready", "first step")  # in the order a process reaches them


def enabled() -> bool:
    return os.environ.get(STARTUP_ENV) == "1"


def process_started() -> float:
    """This process's start (wall clock) as the kernel recorded it (so the interpreter's own start counts); now
    where /proc cannot say."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return time.time()
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


_name: list[str] = []  # this process's name in the table, set by its entry point


def name(process: str) -> None:
    """Name this process in the table ("engine-0", "trainer rank 1"); its marks are recorded from now on."""
    _name[:] = [process]


def forget() -> None:
    """A process forked from a named one (launch/template.py) records nothing until it names itself."""
    _name.clear()


def mark(phase: str, path: str | Path | None = None) -> None:
    """Record that this process (named by name()) reached ``phase``: a line in ``path`` (default:
    RUN/logs/startup.jsonl of $SLIMECLI_RUN_DIR); nothing unless profiling is on and the process has a name.
    Never fails."""
    if not enabled() or not _name:
        return
    path = path or run_file(os.environ)
    if path is not None:
        write(row(_name[0], phase), path)


def row(process: str, phase: str) -> dict[str, Any]:
    """A line of startup.jsonl: this process, named ``process``, reached ``phase`` now."""
    times = os.times()
    return {"process": process, "pid": os.getpid(), "phase": phase, "at": time.time(),
            "cpu_s": round(times.user + times.system, 3), "started": process_started()}


def run_file(env: Mapping[str, str]) -> Path | None:
    """RUN/logs/startup.jsonl of a process with this environment, where it profiles its start-up."""
    run_dir = env.get("SLIMECLI_RUN_DIR")
    return Path(run_dir) / "logs" / STARTUP_FILE if env.get(STARTUP_ENV) == "1" and run_dir else None


def write(line: dict[str, Any], path: str | Path) -> None:
    """Append one line (never fails)."""
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:  # one short append: lines of several processes do not interleave
            f.write(json.dumps(line) + "\n")
    except OSError:
        pass


@dataclass
class ProcessStartup:
    process: str
    started: float
    phases: dict[str, tuple[float, float]] = field(default_factory=dict)  # phase -> (wall clock, CPU-seconds)


def read(path: str | Path) -> list[ProcessStartup]:
    """The processes of a startup.jsonl, in the order they started (a restarted one: its latest start)."""
    found: dict[tuple[str, int], ProcessStartup] = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            row = json.loads(line)
            key = (str(row["process"]), int(row["pid"]))
            proc = found.setdefault(key, ProcessStartup(key[0], float(row["started"])))
            proc.phases[str(row["phase"])] = (float(row["at"]), float(row["cpu_s"]))
        except (ValueError, KeyError, TypeError):
            continue  # a line cut off by a kill
    latest: dict[str, ProcessStartup] = {}
    for proc in found.values():
        if proc.process not in latest or proc.started >= latest[proc.process].started:
            latest[proc.process] = proc
    return sorted(latest.values(), key=lambda p: p.started)


def table(processes: list[ProcessStartup], since: float) -> list[str]:
    """One line per process: when it started and reached each phase, in seconds since ``since`` (the command's
    start), with the process's CPU-seconds until then in brackets; "-" for a phase it does not have."""
    phases = [p for p in PHASES if any(p in proc.phases for proc in processes)]
    width = max([len("process"), *(len(p.process) for p in processes)])
    head = f"{'process':<{width}}  {'started':>8}" + "".join(f"  {p:>16}" for p in phases)
    lines = [head]
    for proc in processes:
        cells = []
        for phase in phases:
            got = proc.phases.get(phase)
            cells.append(f"{'-':>16}" if got is None else f"{got[0] - since:>8.2f} ({got[1]:5.2f})")
        lines.append(f"{proc.process:<{width}}  {proc.started - since:>8.2f}" + "".join(f"  {c}" for c in cells))
    total = sum(max((cpu for _, cpu in proc.phases.values()), default=0.0) for proc in processes)
    lines.append(f"seconds since the command started; (CPU-seconds of the process until then); "
                 f"{total:.2f} CPU-seconds in all until each one's last phase")
    return lines
