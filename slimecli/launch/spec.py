"""A process the controller starts: what to run and how to know it is ready."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class Probe:
    """Ready when GET `url` answers `status`."""

    url: str
    status: int = 200


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
