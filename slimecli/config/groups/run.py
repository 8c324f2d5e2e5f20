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
    seed: int = 1234
    log_level: Literal["debug", "info", "warning", "error"] = spec("info", resumable=True)
    # An existing run.dir resumes. auto: only changes that keep the run meaningful (steps, save interval,
    # logging, ports, timeouts) are allowed; force: any change (each is recorded).
    resume: Literal["auto", "force"] = spec("auto", resumable=True)
