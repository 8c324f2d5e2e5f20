"""What an environment gave, as one line of text each: a value (shortened), a message, a tool and its schema.
`slimecli env check` and the transcripts of `slimecli env run` show observations with these."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

SHORT = 240  # characters of a message or a policy turn shown (None: all)


def shorten(value: Any, limit: int | None = SHORT) -> str:
    """One line: newlines shown as \\n, cut at `limit` characters with the count of the rest."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    if limit is not None and len(text) > limit:
        return f"{text[:limit]}… (+{len(text) - limit} chars)"
    return text


def message_line(message: Mapping[str, Any], limit: int | None = SHORT) -> str:
    role = str(message.get("role", "?"))
    if role == "tool" and message.get("name"):
        role = f"tool {message['name']}"
    return f"{role}: {shorten(message.get('content', ''), limit)}"


def _function(schema: Any) -> Mapping[str, Any]:
    """A tool schema's function part ({"type": "function", "function": {...}} or the function itself)."""
    fn = schema.get("function", schema) if isinstance(schema, Mapping) else {}
    return fn if isinstance(fn, Mapping) else {}


def tool_lines(tools: list[dict[str, Any]] | None, limit: int | None = SHORT) -> list[str]:
    """Each tool: its name and description, then its parameters' schema."""
    out = []
    for schema in tools or []:
        fn = _function(schema)
        desc = f": {shorten(fn['description'], limit)}" if fn.get("description") else ""
        out.append(f"{fn.get('name', '?')}{desc}")
        out.append(f"  parameters {shorten(fn.get('parameters', {}), limit)}")
    return out


def names_of(tools: list[dict[str, Any]] | None) -> list[str]:
    return [str(_function(schema).get("name", "?")) for schema in tools or []]


def tool_names(tools: list[dict[str, Any]] | None) -> str:
    return ", ".join(names_of(tools)) or "none"
