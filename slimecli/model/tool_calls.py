"""A model's raw output text -> reasoning, text and tool calls, one parser per chat-template family (agent adapters and
the environment rollout both read tool calls this way)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from slimecli.config.import_path import load


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedOutput:
    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    ill_formed: bool = False  # a tool call was attempted but could not be parsed: returned as plain text


@dataclass(frozen=True)
class ToolCallFormat:
    """How a parser's tool calls are written, so constrained decoding can emit exactly what `parse` accepts.

    A call is `open + {"name": <name>, "arguments": <object>} + close` (JSON with ", " and ": " separators, as
    the chat template re-renders it); several calls are joined by `separator`; plain text must not contain
    any of `forbidden` (the parser would take it for a broken call).
    """

    open: str
    close: str
    separator: str
    forbidden: tuple[str, ...]

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        return f"{self.open}{body}{self.close}"


class ToolParser(Protocol):
    def parse(self, text: str) -> ParsedOutput: ...


class StreamingToolParser(ToolParser, Protocol):
    def stream_view(self, text: str) -> tuple[str | None, str | None]:
        """What of a partial output is already certain: (reasoning, text) such that, for every output that
        starts with `text`, `parse` gives that reasoning ("" for None) and a text starting with the returned
        text. (None, None) while nothing is certain. A parser without it streams everything at the end."""
        ...


class HermesToolParser:
    """Qwen / Hermes layout: optional `<think>...</think>`, then text, then `<tool_call>{json}</tool_call>` blocks."""

    THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.DOTALL)
    CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
    # What Qwen's chat template renders for calls (and `parse` reads back); a constrained turn uses it.
    call_format = ToolCallFormat(open="<tool_call>\n", close="\n</tool_call>", separator="\n",
                                 forbidden=("<tool_call>",))

    def parse(self, text: str) -> ParsedOutput:
        out = ParsedOutput()
        m = self.THINK.match(text)
        if m:
            out.reasoning = m.group(1).strip("\n")
            text = text[m.end():]
        if "<tool_call>" not in text:
            out.text = text.strip()
            return out
        calls = []
        for block in self.CALL.finditer(text):
            call = _call_from_json(block.group(1))
            if call is None:
                return ParsedOutput(text=text.strip(), reasoning=out.reasoning, ill_formed=True)
            calls.append(call)
        rest = self.CALL.sub("", text)
        if not calls or "<tool_call>" in rest or "</tool_call>" in rest:  # unterminated or stray markers
            return ParsedOutput(text=text.strip(), reasoning=out.reasoning, ill_formed=True)
        out.text = text[:text.index("<tool_call>")].strip()
        out.tool_calls = calls
        return out

    def stream_view(self, text: str) -> tuple[str | None, str | None]:
        """The streaming rule of this layout (see StreamingToolParser):
        - a leading `<think>` block is certain once `</think>` arrives; until then (and while the output could
          still begin with `<think>`) nothing is shown;
        - text is shown up to the first `<tool_call>` (a call, well-formed or not, is only known at the end),
          minus a tail that could be the start of `<tool_call>`, and minus trailing whitespace (the reply text
          is stripped)."""
        m = self.THINK.match(text)
        reasoning = None
        if m:
            reasoning, text = m.group(1).strip("\n"), text[m.end():]
        else:
            head = text.lstrip()
            if head.startswith("<think>") or "<think>".startswith(head):
                return None, None
        cut = text.find("<tool_call>")
        text = text[:cut] if cut >= 0 else text[:len(text) - partial_suffix(text, ("<tool_call>",))]
        return reasoning, text.strip()


def partial_suffix(text: str, markers: tuple[str, ...] | list[str]) -> int:
    """Length of the longest tail of `text` that is a prefix of one of `markers` (a marker itself included)."""
    best = 0
    for marker in markers:
        for k in range(min(len(marker), len(text)), best, -1):
            if text.endswith(marker[:k]):
                best = k
                break
    return best


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _encodable(value: Any) -> bool:
    """No lone surrogate anywhere (a `\\ud800` escape the model wrote): such a call could not be sent on."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return True


def _call_from_json(raw: str) -> ToolCall | None:
    try:
        obj = json.loads(raw, parse_constant=_no_constant)  # NaN / Infinity are no JSON a client could read
    except (ValueError, RecursionError):
        return None
    if not _encodable(obj):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models emit the arguments as a JSON string
        try:
            args = json.loads(args, parse_constant=_no_constant)
        except (ValueError, RecursionError):
            return None
        if not _encodable(args):
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], args)


PARSERS: dict[str, type] = {"qwen": HermesToolParser, "hermes": HermesToolParser}


def get_parser(name: str) -> ToolParser:
    """A registered name, or an import path `package.module:Class` / `package.module.Class`."""
    if name in PARSERS:
        return PARSERS[name]()
    if "." in name or ":" in name:
        return load_object(name)()
    raise ValueError(f"unknown agent.tool_parser {name!r}; valid: {', '.join(sorted(PARSERS))} or an import path")


def load_object(path: str) -> Any:
    """A class or function by import path: `package.module:Class` (the one loader's form) or `package.module.Class`."""
    spec = path if ":" in path else ":".join(path.rsplit(".", 1))
    try:
        return load(spec)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise ValueError(f"cannot import {path!r}: {exc}") from exc
