"""Start the plan's processes, stream their logs, and tear everything down on any failure.

Servers start first and must answer their readiness probe; then the workers. The run
succeeds when every worker exits 0; a plan of servers alone (`slimecli teacher serve`) runs
until it is stopped or a server dies. Any other exit, a readiness timeout, Ctrl-C or
SIGTERM stops every child's process group (TERM, then KILL after a grace period).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from slimecli.launch import pdeathsig
from slimecli.launch.failure import strip_prefix, summary
from slimecli.launch.quiet import ConsoleFilter
from slimecli.launch.spec import ProcessSpec
from slimecli.launch.stall import StallWatch, dump_stacks
from slimecli.launch.watchdog import PARENT_ENV
from slimecli.process import terminate_groups

COLOURS = ["cyan", "magenta", "green", "yellow", "blue", "bright_cyan", "bright_magenta", "bright_green"]


class LaunchError(RuntimeError):
    """A child failed; the message names it, its exit code and the tail of its log."""


@dataclass
class Child:
    spec: ProcessSpec
    proc: subprocess.Popen[bytes]
    log_path: Path
    colour: str
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=400))
    quiet: ConsoleFilter = field(default_factory=ConsoleFilter)
    pump: threading.Thread | None = None

    def tail_text(self, n: int = 20) -> str:
        """The last `n` lines, preceded by the first traceback when it scrolled out of them
        (torchrun prints its own summary after the worker's real error)."""
        lines = list(self.tail)
        if not lines:
            return "    (no output)"
        shown = lines[-n:]
        first = next((i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line), None)
        if first is not None and first < len(lines) - n:
            block = lines[first:first + 40]
            end = next((i for i, line in enumerate(block) if i and not strip_prefix(line).startswith(" ")
                        and "Traceback" not in line), len(block) - 1)
            shown = block[:end + 1] + ["..."] + shown
        return "\n".join(f"    {line}" for line in shown)

    def failure(self, what: str) -> str:
        """What the user reads last: the tail of the log, then one line naming the child, why and where its log is."""
        return f"{self.tail_text()}\n{summary(self.spec.name, what, list(self.tail), self.log_path)}"


# A server's line that reaches the console even when not verbose: what the user has to see.
_NOTABLE = re.compile(r"\b(WARNING|ERROR|CRITICAL|FATAL)\b|Traceback|Error:")


class Supervisor:
    def __init__(self, specs: list[ProcessSpec], log_dir: str | Path, console: Console | None = None,
                 grace_s: float = 10.0, poll_s: float = 0.2, verbose: bool = True, stall: StallWatch | None = None):
        self.specs = specs
        self.stall = stall  # the progress watchdog (launch/stall.py), armed once the workers start
        self.verbose = verbose  # False: servers' routine lines go to their logs only (warnings still print)
        self.log_dir = Path(log_dir)
        self.console = console or Console(highlight=False, soft_wrap=True)
        self.grace_s = grace_s
        self.poll_s = poll_s
        self.children: list[Child] = []
        self._stop_signal: int | None = None
        self._print_lock = threading.Lock()
        self._tearing_down = False  # once set, children's output goes to their logs only
        self.failed: str | None = None  # what ended a failed run: "worker" (it died), "server", or "stall"
        self._loading: dict[int, tuple[Child, float]] = {}  # awaited servers not ready yet: pid -> (child, deadline)

    # ---- public -------------------------------------------------------------------------
    def run(self) -> int:
        """Run the plan to completion; return the controller's exit code."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            for spec in [s for s in self.specs if s.kind == "server"]:
                self._start(spec)
            workers = [s for s in self.specs if s.kind == "worker"]
            for child in list(self.children):
                if workers and child.spec.awaited_by_workers and child.spec.probe is not None:
                    self._loading[child.proc.pid] = (child, time.monotonic() + child.spec.start_timeout_s)
                else:
                    self._wait_ready(child)
            for spec in workers:  # beside the servers still loading, which they wait for themselves
                self._start(spec)
            self._watch()
            self._say("[bold green]run finished[/]")
            return 0
        except LaunchError as exc:
            self._say(f"[bold red]{escape(str(exc))}[/]")
            return 1
        except _Interrupted as exc:
            self._say(f"[bold yellow]stopping: received {signal.Signals(exc.signum).name}[/]")
            return 128 + exc.signum
        finally:
            for s in previous:  # a second Ctrl-C must not interrupt the teardown
                signal.signal(s, signal.SIG_IGN)
            self.shutdown()
            for s, handler in previous.items():
                signal.signal(s, handler)

    def shutdown(self) -> None:
        """TERM every child's process group, then KILL whatever outlives the grace period."""
        self._tearing_down = True  # shutdown noise (e.g. torchrun's SIGTERM traceback) stays in the logs
        by_group = {c.proc.pid: c for c in self.children}  # each child leads its own session's group
        stubborn = terminate_groups({pgid: c.proc for pgid, c in by_group.items()}, self.grace_s)
        for pgid in stubborn:
            self._say(f"[yellow]{by_group[pgid].spec.name} ignored SIGTERM for {self.grace_s:.0f}s; killed[/]")
        for child in self.children:
            child.proc.wait()
            if child.pump is not None:
                child.pump.join(timeout=2)

    # ---- internals ----------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: object) -> None:
        self._stop_signal = signum
        raise _Interrupted(signum)

    def _start(self, spec: ProcessSpec) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **spec.env, PARENT_ENV: str(os.getpid())}
        # No preexec_fn (unsafe with the log pumps' threads): a new session in C, and the
        # parent-death signal set by a small exec wrapper (slimecli.launch.pdeathsig).
        proc = subprocess.Popen(pdeathsig.command(spec.argv), env=env, cwd=spec.cwd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        child = Child(spec, proc, self.log_dir / f"{spec.name}.log", COLOURS[len(self.children) % len(COLOURS)])
        child.pump = threading.Thread(target=self._pump, args=(child,), daemon=True, name=f"log-{spec.name}")
        child.pump.start()
        self.children.append(child)
        self._say(f"started [bold]{spec.name}[/] (pid {proc.pid})")
        return child

    def _pump(self, child: Child) -> None:
        assert child.proc.stdout is not None
        with open(child.log_path, "ab", buffering=0) as log:
            for raw in iter(child.proc.stdout.readline, b""):
                log.write(raw)
                line = raw.decode("utf-8", "replace").rstrip("\n")
                child.tail.append(line)
                if self._tearing_down or not self._shown(child, line):
                    continue
                with self._print_lock:
                    self.console.print(f"[{child.colour}]{child.spec.name:>10} |[/] {escape(line)}")

    def _shown(self, child: Child, line: str) -> bool:
        """Whether the console shows a child's line: all when verbose; else a worker's lines less library noise
        (launch/quiet.py) and a server's notable ones."""
        if self.verbose:
            return True
        quiet = child.quiet.noise(line) is None  # every line, in order: a warning's source line follows it
        return quiet and (child.spec.kind != "server" or bool(_NOTABLE.search(line)))

    def _wait_ready(self, child: Child) -> None:
        probe = child.spec.probe
        if probe is None:
            return
        deadline = time.monotonic() + child.spec.start_timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            if _probe_ok(probe.url, probe.status):
                self._say(f"[bold]{child.spec.name}[/] is ready ({probe.url})")
                return
            time.sleep(0.5)
        raise self._not_ready(child)

    def _not_ready(self, child: Child) -> LaunchError:
        assert child.spec.probe is not None
        return LaunchError(f"{child.spec.name} was not ready within {child.spec.start_timeout_s:.0f}s "
                           f"({child.spec.probe.url} never answered {child.spec.probe.status}); last lines of "
                           f"{child.log_path}:\n" + child.failure(f"not ready within {child.spec.start_timeout_s:.0f}s"))

    def _check_loading(self) -> None:
        """The servers the workers started beside: say when each is ready; fail the run past its timeout."""
        for pid, (child, deadline) in list(self._loading.items()):
            assert child.spec.probe is not None
            if _probe_ok(child.spec.probe.url, child.spec.probe.status):
                del self._loading[pid]
                self._say(f"[bold]{child.spec.name}[/] is ready ({child.spec.probe.url})")
            elif time.monotonic() > deadline:
                self.failed = "server"
                raise self._not_ready(child)

    def _check_alive(self) -> None:
        for child in self.children:
            code = child.proc.poll()
            if code is None:
                continue
            if child.spec.kind == "worker" and code == 0:
                continue
            if child.pump is not None:
                child.pump.join(timeout=2)
            self.failed = child.spec.kind
            what = "exited" if code >= 0 else f"was killed by {signal.Signals(-code).name}"
            short = f"exit code {code}" if code >= 0 else f"killed by {signal.Signals(-code).name}"
            raise LaunchError(f"{child.spec.name} {what} (exit code {code}); last lines of {child.log_path}:\n"
                              + child.failure(short))

    def _watch(self) -> None:
        workers = [c for c in self.children if c.spec.kind == "worker"]
        if self.stall is not None:
            self.stall = StallWatch(self.stall.progress, self.stall.timeout_s, self.stall.start_grace_s)  # from now
        probed = 0.0
        while True:
            self._check_alive()
            if workers and all(c.proc.poll() == 0 for c in workers):
                return
            if self._loading and time.monotonic() - probed >= 0.5:
                self._check_loading()
                probed = time.monotonic()
            self._check_progress()
            time.sleep(self.poll_s)

    def _check_progress(self) -> None:
        """A run with no step for run.stall_timeout_s: every worker's stacks to its log, then fail, naming them."""
        quiet = self.stall.stalled_for() if self.stall is not None else None
        if quiet is None:
            return
        self._say(f"[bold red]no training step completed in {quiet:.0f}s (run.stall_timeout_s): asking every "
                  "process for its Python stacks[/]")
        self.failed = "stall"
        said = dump_stacks([c.proc.pid for c in self.children])
        time.sleep(2.0)  # faulthandler writes at once; the log pumps need a moment
        logs = ", ".join(str(c.log_path) for c in self.children)
        raise LaunchError(f"the run is stalled: no training step in {quiet:.0f}s (run.stall_timeout_s); "
                          + "; ".join(said) + f". Logs: {logs}")

    def _say(self, text: str) -> None:
        with self._print_lock:
            self.console.print(f"[dim]slimecli |[/] {text}")


class _Interrupted(BaseException):
    def __init__(self, signum: int):
        self.signum = signum


def _probe_ok(url: str, status: int) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            code: int = resp.status  # urlopen's result is untyped in the stubs
            return code == status
    except urllib.error.HTTPError as exc:
        return exc.code == status
    except (OSError, ValueError):
        return False
