from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from slimecli.config.decode import spec


@dataclass(frozen=True)
class RunConfig:
    """Where a run lives and how it is named."""

    name: str = spec("quickstart", resumable=True)
    dir: str | None = None  # explicit run directory; None -> <root>/<name>-<timestamp>
    root: str = spec("runs", resumable=True)
    seed: int = spec(1234, note="any 64-bit int seeds torch")
    log_level: Literal["debug", "info", "warning", "error"] = spec("info", resumable=True)
    # An existing run.dir resumes. auto: only changes that keep the run meaningful (steps, save interval,
    # logging, ports, timeouts) are allowed; force: any change (each is recorded).
    resume: Literal["auto", "force"] = spec("auto", resumable=True)
    # no training step completed for this long (before the trainer is up, rollout.start_timeout_s more): every
    # process's Python stacks go to its log, and the run fails, naming them (docs/reliability.md); 0: never
    stall_timeout_s: float = spec(3600.0, ge=0, note="0: never", resumable=True)
    on_stall: Literal["fail", "restart"] = spec("fail", resumable=True)  # restart: as a dead trainer (max_restarts)
    # a trainer rank that dies (or a stall, with run.on_stall=restart): the run resumes from its newest usable
    # checkpoint by itself, at most this many times; each attempt's logs are kept in RUN/logs/attempt-<k>/
    max_restarts: int = spec(0, ge=0, resumable=True)
