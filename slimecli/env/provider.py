"""What an adapter gives the rollout: one loaded environment, its episodes and its own tasks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from slimecli.env.protocol import Environment


class EnvNotFound(LookupError):
    """env.id names nothing this adapter can load: the config error offers `known` as did-you-mean."""

    def __init__(self, kind: str, env_id: str, known: Sequence[str], detail: str = "") -> None:
        self.kind, self.env_id, self.known, self.detail = kind, env_id, list(known), detail
        super().__init__(f"env={kind}: no environment {env_id!r}" + (f" ({detail})" if detail else ""))


class EnvLoadError(RuntimeError):
    """The environment was found but could not be loaded (its library is missing, its arguments are wrong, it is
    a kind of program the adapter does not run): the message says which and what to do."""


class EnvProvider:
    """One loaded environment (a source of a run): fresh episodes, and its own tasks where it has some."""

    kind = "native"

    def __init__(self, env_id: str, args: Mapping[str, Any]) -> None:
        self.env_id = env_id
        self.args = dict(args)

    def tasks(self, split: str = "train") -> list[dict[str, Any]] | None:
        """The environment's own task rows (each passed to reset), or None: the run's task.path rows are used."""
        return None

    def episode(self) -> Environment:
        """A new episode's environment, not yet reset."""
        raise NotImplementedError

    def describe(self) -> str:
        """Where it was loaded from, for `slimecli env check` and the logs."""
        return f"{self.kind}:{self.env_id}"

    async def aclose(self) -> None:
        """Release what load() started (servers, pools)."""
