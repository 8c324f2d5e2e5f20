from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from slimecli.config.decode import spec
from slimecli.config.port import Port, port_field

# Constrained decoding of each turn (slimecli.model.tool_grammar): none | tool_calls (text or a call valid against the
# request's tools and tool_choice) | choices (exactly one of the session's listed alternatives until a tool ran)
Constrain = Literal["none", "tool_calls", "choices"]
# agent.constrain=choices, once the chosen tool ran: final (the text agent.choices_final) | none | tool_calls
ChoicesThen = Literal["final", "none", "tool_calls"]


@dataclass(frozen=True)
class AgentConfig:
    """Coding-agent back-end: the CLI harness and the LLM API adapter it talks to."""

    name: str = "none"  # none | claude_code | codex | an entry of `registry`
    host: str = spec("127.0.0.1", resumable=True)
    port: Port = port_field(zero_is_auto=True)  # the adapter's; auto (or 0): a free port, printed when it listens
    max_turns: int = spec(64, gt=0)
    tool_parser: str = "qwen"
    binary: str | None = None  # a CLI binary to use instead of the installed one
    tools_dir: str | None = None  # where `slimecli agent install` puts the CLIs
    # The CLI's built-in tools offered to the model (claude_code: --tools): None -> the CLI's default set. Each
    # tool's schema is part of every request's prompt, so a short list makes a small model's context short.
    tools: tuple[str, ...] | None = None
    time_budget_s: float = spec(1800.0, gt=0)
    eval_budget_s: float = spec(600.0, gt=0)
    concurrency: int = spec(16, gt=0)
    max_retries: int = spec(2, ge=0)  # training: a run lost to the infrastructure (sandbox, CLI, adapter) is redone this often
    keep_runs: int = spec(64, ge=0)  # training: the last N agent runs kept under RUN/agent/runs (transcript, diff); 0 = none
    on_timeout: Literal["mask", "zero"] = "mask"  # training: a run the model ran out of time/turns in is masked or 0
    harness: str | None = None  # import path of a custom harness class
    adapter: str | None = None  # import path of a custom adapter class
    advertise_host: str | None = None  # how sandboxes reach the adapter when agent.host binds 0.0.0.0 (default:
    # agent.host, or 127.0.0.1 for a wildcard bind)
    engine_url: str | None = None  # a running engine (SGLang API) to use instead of starting the embedded one
    max_new_tokens: int = spec(1024, gt=0)  # per-turn cap on what the CLI asks for (it is also clamped to the context left)
    max_context_len: int | None = spec(None, gt=0, note="or unset")  # None -> the model's max_position_embeddings
    realign_min_ratio: float = spec(0.8, ge=0, le=1)  # re-rendered last response this similar to the sampled one -> realigned
    output: str | None = None  # `slimecli agent run`: samples JSONL; None -> <run.root>/agent-<time>/samples.jsonl
    constrain: Constrain = "none"  # a grammar in the engine's sampling params for each turn (Constrain above)
    choices_then: ChoicesThen = "final"  # after the choice ran (ChoicesThen above)
    choices_final: str = "Done."
    choices_file: str | None = None  # JSON list of choices (texts or {"name", "arguments"}) for every session
    constrain_max_string_len: int | None = spec(None, gt=0, note="or unset")  # cap free string arguments of constrained calls (random models)
