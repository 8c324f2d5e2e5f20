"""Servers kept alive: an engine or teacher that dies or hangs is restarted, within its restart budget.

Each server with a Health (launch/spec.py) is probed on a thread of its own once it is ready. The supervisor asks
every poll whether it died (its process exited) or hangs (no probe answered for health.timeout_s, or a restarted
one not ready within its start timeout); then its Python stacks are taken where it is a slimecli process, its
process group is killed and the same command starts again, on the same port. The dead process's log is kept as
``<name>.<k>.log`` (k: which process it was, from 0) and the new one writes ``<name>.log``. RUN/restarts.jsonl
gets a line per restart (the trainer's metrics count them: run/server_restarts). A restarted engine of a training
run starts with SLIMECLI_AWAIT_WEIGHTS=1: it generates nothing until the trainer has given it the current weights
(train/coordinator/recovery.py).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from slimecli.launch.spec import Health
from slimecli.net.probe import probe_ok
from slimecli.process import AWAIT_WEIGHTS_ENV, SERVER_RESTART_ENV

__all__ = ["AWAIT_WEIGHTS_ENV", "SERVER_RESTART_ENV", "HealthProbe", "keep_log"]

LOADING_POLL_S = 0.1  # how often a server not yet ready is probed


class HealthProbe:
    """GET health.url every health.interval_s on a daemon thread; remembers when it last answered 200. Until the
    first 200 it probes every LOADING_POLL_S: a server ready for a moment and then hung (its first request blocks it)
    is seen ready, so it counts as hung after health.timeout_s, not only after its start timeout."""

    def __init__(self, health: Health, start_timeout_s: float, ready: bool) -> None:
        self.health, self.start_timeout_s = health, start_timeout_s
        self.started = time.monotonic()
        self.last_ok: float | None = self.started if ready else None
        self.announced = ready  # a (re)started server's readiness is said once
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"health-{health.url}")
        self._thread.start()

    def _run(self) -> None:
        h = self.health
        while not self._stop.is_set():
            if probe_ok(h.url, 200, timeout_s=h.timeout_s):
                self.last_ok = time.monotonic()
            self._stop.wait(h.interval_s if self.ready else min(h.interval_s, LOADING_POLL_S))

    def trouble(self) -> str | None:
        """Why the server counts as hung now, else None: a (re)started server not ready within its start timeout, or
        a ready one (past health.start_grace_s) that answered no probe for health.timeout_s."""
        now = time.monotonic()
        if self.last_ok is None:
            waited = now - self.started
            return f"not ready within {self.start_timeout_s:.0f}s" if waited >= self.start_timeout_s else None
        if now - self.started < self.health.start_grace_s:
            return None
        quiet = now - self.last_ok
        if quiet < self.health.timeout_s:
            return None
        return f"hung: no answer from {self.health.url} for {quiet:.0f}s"

    def answered(self) -> None:
        """The server answered its readiness probe: from now a silence counts as a hang (health.timeout_s), even
        one that begins before this thread's own first probe gets through."""
        if self.last_ok is None:
            self.last_ok = time.monotonic()

    @property
    def ready(self) -> bool:
        return self.last_ok is not None

    def stop(self) -> None:
        self._stop.set()


def keep_log(log_path: Path) -> Path:
    """A dead server's log renamed ``<name>.<k>.log``, k the first free number: the next process writes afresh."""
    k = 0
    while (kept := log_path.with_name(f"{log_path.stem}.{k}.log")).exists():
        k += 1
    if log_path.exists():
        log_path.rename(kept)
    return kept
