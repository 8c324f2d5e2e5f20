from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AgentConfig:
    """Coding-agent back-end: the CLI harness and the LLM API adapter it talks to."""

    name: str = "none"  # none | claude_code | codex | an entry of `registry`
    host: str = "127.0.0.1"
    port: int = 18001
    max_turns: int = 64
    tool_parser: str = "qwen"
    binary: str | None = None  # a CLI binary to use instead of the installed one
    tools_dir: str | None = None  # where `slimecli agent install` puts the CLIs
    time_budget_s: float = 1800.0
    eval_budget_s: float = 600.0
    concurrency: int = 16
    harness: str | None = None  # import path of a custom harness class
    adapter: str | None = None  # import path of a custom adapter class
