"""Start the plan's processes, stream their logs, and tear everything down on any failure.

Servers start first and must answer their readiness probe; then the workers. The run
succeeds when every worker exits 0; a plan of servers alone (`slimecli teacher serve`) runs
until it is stopped or a server fails. A server that dies or hangs is restarted within its
budget (launch/restarts.py). Any other exit, a readiness timeout, Ctrl-C or SIGTERM stops
every child's process group (TERM, then KILL after a grace period).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from slimecli.launch import pdeathsig
from slimecli.launch.failure import strip_prefix, summary
from slimecli.launch.forked import ForkedProcess, Template, drop_early, forkable
from slimecli.launch.quiet import ConsoleFilter
from slimecli.launch.restarts import AWAIT_WEIGHTS_ENV, SERVER_RESTART_ENV, HealthProbe, keep_log
from slimecli.launch.spec import ProcessSpec
from slimecli.launch.stall import StallWatch, dump_stacks
from slimecli.launch.template import SERVING
from slimecli.launch.watchdog import PARENT_ENV
from slimecli.net.probe import poll_delays, probe_ok
from slimecli.observe.restarts import record_restart
from slimecli.process import kill_group, terminate_groups

COLOURS = ["cyan", "magenta", "green", "yellow", "blue", "bright_cyan", "bright_magenta", "bright_green"]


class LaunchError(RuntimeError):
    """A child failed; the message names it, its exit code and the tail of its log."""


@dataclass
class Child:
    spec: ProcessSpec
    proc: subprocess.Popen[bytes] | ForkedProcess  # forked from the run's template (launch/template.py) or not
    log_path: Path
    colour: str
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=400))
    quiet: ConsoleFilter = field(default_factory=ConsoleFilter)
    pump: threading.Thread | None = None
    last_output: float = 0.0  # when its log pump last copied a line (Supervisor._settle)

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
                 grace_s: float = 10.0, poll_s: float = 0.2, verbose: bool = True, stall: StallWatch | None = None,
                 restart_log: Path | None = None):
        self.specs = specs
        self.probes: dict[str, HealthProbe] = {}  # the servers kept alive, by name (launch/restarts.py)
        self.restarts: dict[str, int] = {}  # restarts so far, by server name
        self.restart_log = restart_log  # RUN/restarts.jsonl (observe/restarts.py); None: not recorded
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
        self.template: Template | None = None  # forks the plan's `python -m slimecli.X` children (launch/forked.py)
        self._output_ended = threading.Event()  # a child's output reached its end (it is exiting): _watch looks

    # ---- public -------------------------------------------------------------------------
    def run(self) -> int:
        """Run the plan to completion; return the controller's exit code."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._start_template()
            for spec in [s for s in self.specs if s.kind == "server"]:
                self._start(spec)
            workers = [s for s in self.specs if s.kind == "worker"]
            for child in list(self.children):
                if workers and child.spec.awaited_by_workers and child.spec.probe is not None:
                    # the workers wait for it themselves: they start now, beside its loading (_check_loading)
                    self._loading[child.proc.pid] = (child, time.monotonic() + child.spec.start_timeout_s)
                    if child.spec.health is not None and child.spec.name not in self.probes:
                        probe = HealthProbe(child.spec.health, child.spec.start_timeout_s, False)
                        probe.announced = True  # _check_loading says when it is ready
                        self.probes[child.spec.name] = probe
                    continue
                self._wait_ready(child)
                if child.spec.health is not None and child.spec.name not in self.probes:
                    self.probes[child.spec.name] = HealthProbe(child.spec.health, child.spec.start_timeout_s, True)
            for spec in workers:  # beside the servers still loading
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
        for probe in self.probes.values():
            probe.stop()
        if self.template is not None:
            self.template.stop()  # ends beside the children, not after them
        by_group = {c.proc.pid: c for c in self.children}  # each child leads its own session's group
        stubborn = terminate_groups({pgid: c.proc for pgid, c in by_group.items()}, self.grace_s)
        for pgid in stubborn:
            self._say(f"[yellow]{by_group[pgid].spec.name} ignored SIGTERM for {self.grace_s:.0f}s; killed[/]")
        for child in self.children:
            child.proc.wait()
            if child.pump is not None:
                child.pump.join(timeout=2)
        if self.template is not None:
            self.template.close()
            self.template = None

    # ---- internals ----------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: object) -> None:
        self._stop_signal = signum
        raise _Interrupted(signum)

    def _start_template(self) -> None:
        """The run's template, importing torch and transformers once for all the children it will fork: where
        there are several, or a server it may restart (one child alone would pay the same imports)."""
        forked = [s for s in self.specs if forkable(s.argv)]
        if len(forked) > 1 or any(s.kind == "server" and s.health is not None for s in forked):
            serving = all(s.argv[2] in SERVING for s in forked)  # engines and evaluators: no transformers model code
            self.template = Template.start(self._env(forked[0]), self.log_dir / "template.log", serving)
        else:
            drop_early()  # the command started one early (launch/forked.py: start_early); this plan needs none

    def _env(self, spec: ProcessSpec) -> dict[str, str]:
        return {**os.environ, **spec.env, PARENT_ENV: str(os.getpid())}

    def _start(self, spec: ProcessSpec, at: int | None = None) -> Child:
        """Start ``spec``; ``at``: in place of the child at that index (a restart), keeping its colour."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = self._env(spec)
        proc: subprocess.Popen[bytes] | ForkedProcess | None = None
        if self.template is not None:
            proc = self.template.fork(spec.argv, env, spec.cwd)
        if proc is None:
            # No preexec_fn (unsafe with the log pumps' threads): a new session in C, and the
            # parent-death signal set by a small exec wrapper (slimecli.launch.pdeathsig).
            proc = subprocess.Popen(pdeathsig.command(spec.argv), env=env, cwd=spec.cwd, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        colour = COLOURS[(len(self.children) if at is None else at) % len(COLOURS)]
        child = Child(spec, proc, self.log_dir / f"{spec.name}.log", colour)
        child.pump = threading.Thread(target=self._pump, args=(child,), daemon=True, name=f"log-{spec.name}")
        child.pump.start()
        if at is None:
            self.children.append(child)
        else:
            self.children[at] = child
        self._say(f"started [bold]{spec.name}[/] (pid {proc.pid})")
        return child

    def _pump(self, child: Child) -> None:
        assert child.proc.stdout is not None
        with open(child.log_path, "ab", buffering=0) as log:
            for raw in iter(child.proc.stdout.readline, b""):
                log.write(raw)
                child.last_output = time.monotonic()
                line = raw.decode("utf-8", "replace").rstrip("\n")
                child.tail.append(line)
                if self._tearing_down or not self._shown(child, line):
                    continue
                with self._print_lock:
                    self.console.print(f"[{child.colour}]{child.spec.name:>10} |[/] {escape(line)}")
        self._output_ended.set()

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
        delays = poll_delays(0.5)
        while time.monotonic() < deadline:
            self._check_alive()
            if probe_ok(probe.url, probe.status):
                self._say(f"[bold]{child.spec.name}[/] is ready ({probe.url})")
                return
            time.sleep(next(delays))
        raise self._not_ready(child)

    def _not_ready(self, child: Child) -> LaunchError:
        assert child.spec.probe is not None
        return LaunchError(f"{child.spec.name} was not ready within {child.spec.start_timeout_s:.0f}s "
                           f"({child.spec.probe.url} never answered {child.spec.probe.status}); last lines of "
                           f"{child.log_path}:\n" + child.failure(f"not ready within {child.spec.start_timeout_s:.0f}s"))

    def _check_loading(self) -> None:
        """The servers the workers started beside: say when each is ready; past its start timeout, fail the run
        (a server kept alive by a health probe is restarted by _check_health instead, within its budget)."""
        for pid, (child, deadline) in list(self._loading.items()):
            assert child.spec.probe is not None
            probe = self.probes.get(child.spec.name)
            if child not in self.children:  # restarted: its health probe watches the new process
                del self._loading[pid]
            elif (probe is not None and probe.ready) or probe_ok(child.spec.probe.url, child.spec.probe.status):
                del self._loading[pid]  # ready (its health probe may have seen it first, if it hung right after)
                if probe is not None:
                    probe.answered()
                self._say(f"[bold]{child.spec.name}[/] is ready ({child.spec.probe.url})")
            elif time.monotonic() > deadline and child.spec.health is None:
                self.failed = "server"
                raise self._not_ready(child)

    def _check_alive(self) -> None:
        for child in list(self.children):
            code = child.proc.poll()
            if code is None:
                continue
            if child.spec.kind == "worker" and code == 0:
                continue
            self._settle([child], time.monotonic(), expect_output=False)  # its last lines, for the message
            what = "exited" if code >= 0 else f"was killed by {signal.Signals(-code).name}"
            short = f"exit code {code}" if code >= 0 else f"killed by {signal.Signals(-code).name}"
            if self._restartable(child):
                self._restart(child, f"{what} (exit code {code})")
                continue
            self.failed = child.spec.kind
            raise LaunchError(f"{child.spec.name} {what} (exit code {code}){self._spent(child)}; last lines of "
                              f"{child.log_path}:\n" + child.failure(short))

    def _check_health(self) -> None:
        """A kept server that hangs: its stacks to its log (where it is a slimecli process), then a restart."""
        for child in list(self.children):
            probe = self.probes.get(child.spec.name)
            if probe is not None and probe.ready and not probe.announced:
                probe.announced = True
                self._say(f"[bold]{child.spec.name}[/] is ready ({probe.health.url})")
            why = probe.trouble() if probe is not None else None
            if why is None:
                continue
            self._say(f"[bold red]{child.spec.name} is {why}[/]: asking it for its Python stacks")
            asked = time.monotonic()
            said = dump_stacks([child.proc.pid]) or ["not a slimecli process: its stacks could not be taken"]
            if any("stacks written" in line for line in said):
                self._settle([child], asked, expect_output=True)
            with open(child.log_path, "a", encoding="utf-8") as log:
                for line in said:
                    log.write(f"slimecli | {line}\n")
                    self._say(f"{child.spec.name}: {escape(line)}")
            if not self._restartable(child):
                self.failed = "server"
                raise LaunchError(f"{child.spec.name} is {why}{self._spent(child)}; last lines of {child.log_path}:\n"
                                  + child.failure(why))
            self._restart(child, why)

    def _restartable(self, child: Child) -> bool:
        h = child.spec.health
        return (child.spec.kind == "server" and h is not None and not self._tearing_down
                and self.restarts.get(child.spec.name, 0) < h.max_restarts)

    def _spent(self, child: Child) -> str:
        h, used = child.spec.health, self.restarts.get(child.spec.name, 0)
        if h is None or child.spec.kind != "server":
            return ""
        if h.max_restarts == 0:
            return f" ({h.setting}=0: not restarted)" if h.setting else ""
        return f" after {used} restart{'s' if used != 1 else ''} ({h.setting}={h.max_restarts} spent)"

    def _restart(self, child: Child, why: str) -> None:
        """Kill what is left of the server's process group, keep its log, start the same command again."""
        name, h = child.spec.name, child.spec.health
        assert h is not None
        probe = self.probes.pop(name, None)
        if probe is not None:
            probe.stop()
        kill_group(child.proc.pid, grace_s=2.0, leader=child.proc)
        child.proc.wait()
        if child.pump is not None:
            child.pump.join(timeout=2)
        kept = keep_log(child.log_path)
        used = self.restarts[name] = self.restarts.get(name, 0) + 1
        if self.restart_log is not None:
            record_restart(self.restart_log, name, used, why)
        self._say(f"[bold yellow]{name} {escape(why)}: restarting it[/] (restart {used} of {h.setting}="
                  f"{h.max_restarts}); its log until now: {kept}")
        env = {**child.spec.env, SERVER_RESTART_ENV: str(used), **({AWAIT_WEIGHTS_ENV: "1"} if h.await_weights else {})}
        fresh = self._start(replace(child.spec, env=env), at=next(i for i, c in enumerate(self.children) if c is child))
        self.probes[name] = HealthProbe(h, fresh.spec.start_timeout_s, ready=False)

    def _watch(self) -> None:
        workers = [c for c in self.children if c.spec.kind == "worker"]
        if self.stall is not None:
            self.stall.rearm()
        probed, wait_s = 0.0, self.poll_s
        while True:
            self._output_ended.clear()
            self._check_alive()
            if workers and all(c.proc.poll() == 0 for c in workers):
                return
            if self._loading and time.monotonic() - probed >= 0.5:
                self._check_loading()
                probed = time.monotonic()
            self._check_health()
            self._check_progress()
            # a child's output ends as it exits: look again at once, and soon after (its exit may not be
            # reapable yet when its pipe closes), instead of a poll period later
            wait_s = 0.02 if self._output_ended.wait(wait_s) else self.poll_s

    def _check_progress(self) -> None:
        """A run with no step for run.stall_timeout_s: every worker's stacks to its log, then fail, naming them."""
        quiet = self.stall.stalled_for() if self.stall is not None else None
        if quiet is None:
            return
        self._say(f"[bold red]no training step completed in {quiet:.0f}s (run.stall_timeout_s): asking every "
                  "process for its Python stacks[/]")
        self.failed = "stall"
        asked = time.monotonic()
        said = dump_stacks([c.proc.pid for c in self.children])
        self._settle(self.children, asked, expect_output=True)
        logs = ", ".join(str(c.log_path) for c in self.children)
        raise LaunchError(f"the run is stalled: no training step in {quiet:.0f}s (run.stall_timeout_s); "
                          + "; ".join(said) + f". Logs: {logs}")

    @staticmethod
    def _settle(children: list[Child], since: float, *, expect_output: bool, bound_s: float = 2.0,
                quiet_s: float = 0.3) -> None:
        """Let the log pumps copy what `children` wrote up to now (a dead child's last lines; the stacks asked for
        at `since`, with `expect_output`: faulthandler writes them at once, a pump copies them a moment later).
        Done when their pipes have all ended, or when their output (new output since `since`, with
        `expect_output`) has been quiet for `quiet_s`; at most `bound_s` after `since`: a dead child's own child
        can hold its pipe open, a child may keep printing, or be too stuck to write."""
        deadline = since + bound_s
        while (now := time.monotonic()) < deadline:
            pumping = [c for c in children if c.pump is not None and c.pump.is_alive()]
            if not pumping:
                return
            last = max(c.last_output for c in pumping)
            if (last > since or not expect_output) and now - max(last, since) >= quiet_s:
                return
            time.sleep(0.05)

    def _say(self, text: str) -> None:
        with self._print_lock:
            self.console.print(f"[dim]slimecli |[/] {text}")


class _Interrupted(BaseException):
    def __init__(self, signum: int):
        self.signum = signum
