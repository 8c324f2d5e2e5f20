"""Agent name -> (harness class, adapter class). SWE_AGENT is resolved into agent.name while the config is
composed; the names live in the one plugin registry (declared in agent/plugins.py, or by `register()`), and a
custom pair comes from the config (agent.harness / agent.adapter import paths)."""

from __future__ import annotations

from typing import Any

from slimecli.config.registry import AGENTS, UnknownPluginError
from slimecli.model.tool_calls import load_object


def register(name: str, harness: str | type, adapter: str | type) -> None:
    """Make agent.name=`name` run `harness` with `adapter` (classes, or import paths loaded when resolved)."""
    AGENTS.register(name, _load(harness), adapter=adapter)


def names() -> list[str]:
    return sorted(AGENTS.names())


def resolve(name: str, harness: str | None = None, adapter: str | None = None) -> tuple[str, type, type]:
    """(name, harness class, adapter class); a clear error that lists the valid names otherwise."""
    if harness and adapter:
        return name, _load(harness), _load(adapter)
    try:
        entry = AGENTS.get(name)
    except UnknownPluginError:
        raise ValueError(f"unknown agent {name!r}; valid: {', '.join(names())} "
                         f"(or set agent.harness and agent.adapter to import paths)") from None
    return name, _load(harness or entry.obj), _load(adapter or entry.options["adapter"])


def _load(ref: str | type) -> Any:
    return ref if isinstance(ref, type) else load_object(ref)
