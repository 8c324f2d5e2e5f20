"""The native environment protocol: what an environment sees of the policy, and what it answers.

An episode is one environment object: ``reset(task)`` opens it with the first messages (and the tools the policy
may call), each ``step(action)`` answers one policy turn, ``close()`` ends it. Adapters put every hub library's
environments behind this protocol; the rollout (slimecli/env/rollout.py) never sees a library.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class Observation:
    """Messages to append to the conversation (chat format: role user | tool | system, content a string), and
    the tools the policy may call from now on (OpenAI function schemas; None: those of the last observation)."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]

    def message_form(self) -> dict[str, Any]:
        """The OpenAI shape an assistant message carries (arguments as a JSON string)."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}


@dataclass(frozen=True)
class Action:
    """One policy turn: the text as sampled (markup kept, the final stop token removed), and what the chat
    template's tool-call format makes of it."""

    text: str
    content: str = ""  # the text without reasoning and tool calls
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    ill_formed: bool = False  # a tool call was attempted but could not be parsed
    parse_error: str = ""  # why, for the observation that tells the policy

    def message(self) -> dict[str, Any]:
        """The assistant message in OpenAI chat form."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = [call.message_form() for call in self.tool_calls]
        return out


@dataclass
class StepResult:
    observation: Observation = field(default_factory=Observation)
    reward: float = 0.0  # this step's reward; an episode's reward is the sum of its steps'
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    """One episode. Sync environments go behind an adapter (see slimecli.env.base.ToolEnv for a helper)."""

    async def reset(self, task: Mapping[str, Any]) -> Observation: ...

    async def step(self, action: Action) -> StepResult: ...

    async def close(self) -> None: ...


def tool_result(call: ToolCall, content: Any) -> dict[str, Any]:
    """The message that answers a tool call."""
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False, default=str)
    return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": text}
