"""Agent name -> (harness class, adapter class). SWE_AGENT is resolved into agent.name while the config is
composed; a third pair comes from config (agent.harness / agent.adapter import paths) or from `register()`."""

from __future__ import annotations

from typing import Any

from slimecli.agent.parsers import load_object

_PAIRS: dict[str, tuple[str, str]] = {
    "claude_code": ("slimecli.agent.harness:ClaudeCodeHarness", "slimecli.agent.anthropic:AnthropicAdapter"),
    "codex": ("slimecli.agent.harness:CodexHarness", "slimecli.agent.responses:ResponsesAdapter"),
}


def register(name: str, harness: str | type, adapter: str | type) -> None:
    _PAIRS[name] = (harness, adapter)  # type: ignore[assignment]


def names() -> list[str]:
    return sorted(_PAIRS)


def resolve(name: str, harness: str | None = None, adapter: str | None = None) -> tuple[str, type, type]:
    """(name, harness class, adapter class); a clear error that lists the valid names otherwise."""
    if harness and adapter:
        return name, _load(harness), _load(adapter)
    if name not in _PAIRS:
        raise ValueError(f"unknown agent {name!r}; valid: {', '.join(names())} "
                         f"(or set agent.harness and agent.adapter to import paths)")
    h, a = _PAIRS[name]
    return name, _load(harness or h), _load(adapter or a)


def _load(ref: str | type) -> Any:
    return ref if isinstance(ref, type) else load_object(ref)
