from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class RunConfig:
    """Where a run lives and how it is named."""

    name: str = "quickstart"
    dir: str | None = None  # explicit run directory; None -> <root>/<name>-<timestamp>
    root: str = "runs"
    seed: int = 1234
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # An existing run.dir resumes. auto: only changes that keep the run meaningful (steps, save interval,
    # logging, ports, timeouts) are allowed; force: any change (each is recorded).
    resume: Literal["auto", "force"] = "auto"
