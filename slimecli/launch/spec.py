"""A process the controller starts: what to run and how to know it is ready."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

SECRET_FLAGS = ("--api-key",)


@dataclass(frozen=True)
class Probe:
    """Ready when GET `url` answers `status`."""

    url: str
    status: int = 200


@dataclass(frozen=True)
class Health:
    """A server the supervisor keeps alive: probed every ``interval_s``; dead, or no probe answered ``url`` for
    ``timeout_s`` (not counted in the first ``start_grace_s`` after a start), it is restarted, at most
    ``max_restarts`` times. ``await_weights``: a restarted engine serves no generation until the trainer gives
    it the current weights."""

    url: str
    interval_s: float
    timeout_s: float
    start_grace_s: float
    max_restarts: int
    await_weights: bool = False
    setting: str = ""  # the config key of max_restarts, for the messages (rollout.max_restarts)


@dataclass(frozen=True)
class ProcessSpec:
    name: str
    argv: list[str]
    kind: Literal["server", "worker"]  # servers start first and must stay up; the run ends when workers finish
    env: dict[str, str] = field(default_factory=dict)  # added to the controller's environment
    cwd: str | None = None
    probe: Probe | None = None
    start_timeout_s: float = 300.0
    ports: list[int] = field(default_factory=list)
    health: Health | None = None  # a server restarted when it dies or hangs (launch/restarts.py)
    # a server the workers wait for themselves (the rollout engines): they start while it loads, and the
    # supervisor checks its readiness probe and timeout beside them
    awaited_by_workers: bool = False

    def to_json(self) -> dict[str, Any]:
        """For plan.json and `slimecli plan --json`: secrets on the command line shown as ***."""
        return {**asdict(self), "argv": self.shown_argv()}

    def shown_argv(self) -> list[str]:
        """argv with the value of every secret-bearing flag (--api-key) replaced by ***."""
        shown = list(self.argv)
        for i, arg in enumerate(shown):
            if arg in SECRET_FLAGS and i + 1 < len(shown):
                shown[i + 1] = "***"
            elif arg.split("=", 1)[0] in SECRET_FLAGS and "=" in arg:
                shown[i] = arg.split("=", 1)[0] + "=***"
        return shown
