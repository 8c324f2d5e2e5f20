"""Grammars for constrained turns (agent.constrain, env.constrain): tool calls valid against the offered tools, or
exactly one of a session's listed alternatives.

A random or barely trained model almost never writes a well-formed tool call, so coding-agent RL on a small
model needs the engine to mask its sampling. The grammars are llguidance's Lark dialect, sent as SGLang's
`sampling_params.ebnf` (the embedded engine passes Lark text through; so does SGLang with the llguidance
grammar backend). Each tool's arguments are an inline `%json` schema, compiled by the engine, so a schema
that cannot be compiled comes back as the engine's 400 and the adapter answers the client with a 400.

The grammar writes what the tool parser reads back (its ToolCallFormat) and what the chat template renders:
marker strings that are added tokens (`<tool_call>`) are referenced by token id, so the sampled ids are the
ones the next prompt contains; arguments are compact JSON (", " and ": " separators), keys in schema order.

Limits: a turn cut by max_tokens or a stop sequence in the middle of a call is still ill-formed (the grammar
cannot make the budget larger); a JSON string argument may spell out a closing marker, which the parser
then misreads (as it would unconstrained).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slimecli.model.tool_calls import ToolCallFormat

TOOL_CHOICE_MODES = ("auto", "required", "none")
# Compact JSON like the chat template's tojson; unsupported schema keywords (propertyNames, if/then, ...) are
# ignored rather than failing every turn of a CLI whose tool list has one of them.
X_GUIDANCE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}
_RX_META = set("\\.+*?()|[]{}^$#&-~/")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LITERALS = ("enum", "const", "default", "examples")


class GrammarError(ValueError):
    """The request (or the registered choices) cannot be turned into a grammar: a 400 for the client."""


@dataclass(frozen=True)
class ToolChoice:
    """The API's tool_choice, normalised: auto (text or a call), required (a call), none (text only)."""

    mode: str = "auto"
    names: tuple[str, ...] | None = None  # only these tools (a named tool, Responses' allowed_tools)
    parallel: bool = True  # several calls in one turn


def literal(text: str, tokens: Mapping[str, int]) -> str:
    """`text` as a sequence of Lark items: quoted strings, and `<[id]>` for every added token it contains."""
    if not text:
        return '""'
    names = sorted((t for t in tokens if t and t in text), key=len, reverse=True)
    if not names:
        return json.dumps(text)
    parts = []
    for piece in re.split("(" + "|".join(map(re.escape, names)) + ")", text):
        if piece in tokens:
            parts.append(f"<[{tokens[piece]}]>")
        elif piece:
            parts.append(json.dumps(piece))
    return " ".join(parts)


def _rx_escape(text: str) -> str:
    """A literal for llguidance's (Rust) regex syntax inside a Lark `/.../`."""
    out = []
    for ch in text:
        if ch in _RX_META:
            out.append("\\" + ch)
        elif ch.isprintable() and ch != " ":
            out.append(ch)
        else:
            out.append(f"\\x{{{ord(ch):x}}}")
    return "".join(out)


def _text_terminal(forbidden: Iterable[str]) -> str:
    """Any text without the strings that would make the parser see a (broken) tool call; added tokens are
    never matched by a regex, so only spelled-out markers need excluding."""
    banned = [_rx_escape(f) for f in forbidden if f]
    if not banned:
        return "TEXT: /(?s:.*)/"
    return f"TEXT: /(?s:.*)/ & ~/(?s:.*(?:{'|'.join(banned)}).*)/"


def cap_strings(schema: Any, limit: int) -> Any:
    """`schema` with maxLength=limit on every string schema that has no bound of its own.

    A random model rarely closes a free string, so its calls run into max_tokens; the capped grammar still
    only writes arguments that validate against the original schema. Literal values are left alone.
    """
    if isinstance(schema, list):
        return [cap_strings(s, limit) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):  # name -> schema (a property may be called "enum")
            out[key] = {n: cap_strings(v, limit) for n, v in value.items()}
        else:
            out[key] = value if key in _LITERALS else cap_strings(value, limit)
    kind = schema.get("type")
    is_string = kind == "string" or (isinstance(kind, list) and "string" in kind)
    if is_string and not any(k in schema for k in ("maxLength", "pattern", "format", "enum", "const")):
        min_len = schema.get("minLength")
        out["maxLength"] = max(limit, min_len) if isinstance(min_len, int) else limit
    return out


def arguments_schema(parameters: Any, name: str, max_string_len: int | None = None) -> dict[str, Any]:
    """The tool's parameter schema as an object schema with the engine's JSON options."""
    if parameters is None or parameters is True:
        parameters = {}
    if not isinstance(parameters, dict):
        raise GrammarError(f"tool {name!r}: the parameters schema must be a JSON object")
    kind = parameters.get("type")
    if kind is None or (isinstance(kind, list) and "object" in kind):
        parameters = {**parameters, "type": "object"}  # the parser takes only an object as arguments
    elif kind != "object":
        raise GrammarError(f"tool {name!r}: the parameters schema must describe an object, not {kind!r}")
    if max_string_len is not None:
        parameters = cap_strings(parameters, max_string_len)
    return {**parameters, "x-guidance": X_GUIDANCE}


def _function(tool: Mapping[str, Any]) -> tuple[str, Any]:
    fn = tool.get("function", tool)
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise GrammarError("every tool needs a non-empty string name")
    return fn["name"], fn.get("parameters")


def tool_call_grammar(tools: Sequence[Mapping[str, Any]], choice: ToolChoice, fmt: ToolCallFormat,
                      tokens: Mapping[str, int], max_string_len: int | None = None) -> str:
    """Plain text or tool calls (per `choice`) whose arguments follow the tools' schemas.

    `tools` are in the OpenAI function shape the chat template renders (slimecli.agent.api.render.tool_schema).
    """
    if choice.mode not in TOOL_CHOICE_MODES:
        raise GrammarError(f"tool_choice mode must be one of {', '.join(TOOL_CHOICE_MODES)}")
    offered = [_function(t) for t in tools]
    if choice.names is not None:
        known = {n for n, _ in offered}
        missing = [n for n in choice.names if n not in known]
        if missing:
            raise GrammarError(f"tool_choice names tools that are not offered to the model: {', '.join(missing)}")
        offered = [(n, p) for n, p in offered if n in choice.names]
    text_rule = _text_terminal(fmt.forbidden)
    if choice.mode == "none":
        return f"start: TEXT\n{text_rule}\n"
    if not offered:
        if choice.mode == "required":
            raise GrammarError("tool_choice requires a tool call, but the request offers no tools")
        return f"start: TEXT\n{text_rule}\n"
    start = "start: calls" if choice.mode == "required" else "start: TEXT | calls"
    calls = f"calls: call ({literal(fmt.separator, tokens)} call)*" if choice.parallel else "calls: call"
    lines = [start, text_rule, calls, "call: " + " | ".join(f"tool_{i}" for i in range(len(offered)))]
    for i, (name, parameters) in enumerate(offered):
        head = fmt.open + '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": '
        schema = json.dumps(arguments_schema(parameters, name, max_string_len), allow_nan=False)
        lines.append(f"tool_{i}: {literal(head, tokens)} args_{i} {literal('}' + fmt.close, tokens)}")
        lines.append(f"args_{i}: %json {schema}")
    return "\n".join(lines) + "\n"


def choices_grammar(texts: Sequence[str], tokens: Mapping[str, int]) -> str:
    """Exactly one of `texts`, then end of text."""
    if not texts or not all(isinstance(t, str) and t for t in texts):
        raise GrammarError("choices must be a non-empty list of non-empty strings")
    lines = ["start: " + " | ".join(f"choice_{i}" for i in range(len(texts)))]
    lines += [f"choice_{i}: {literal(t, tokens)}" for i, t in enumerate(texts)]
    return "\n".join(lines) + "\n"


def resolve_choices(raw: Any, fmt: ToolCallFormat | None) -> tuple[str, ...]:
    """Choices as output texts: a string is the text itself; {"name": ..., "arguments": {...}} is that tool
    call written in the parser's format."""
    if isinstance(raw, str | bytes) or not isinstance(raw, Sequence) or not raw:
        raise GrammarError("choices must be a non-empty list")
    texts = []
    for i, item in enumerate(raw):
        if isinstance(item, str) and item:
            texts.append(item)
        elif isinstance(item, Mapping) and isinstance(item.get("name"), str) and item["name"] and \
                isinstance(item.get("arguments", {}), Mapping):
            if fmt is None:
                raise GrammarError(f"choices[{i}] is a tool call, but the tool parser declares no call format")
            texts.append(fmt.format_call(item["name"], dict(item.get("arguments", {}))))
        else:
            raise GrammarError(f"choices[{i}] must be a non-empty string or "
                               '{"name": <tool name>, "arguments": {...}}')
    return tuple(texts)


def load_choices(path: str | Path, fmt: ToolCallFormat | None) -> tuple[str, ...]:
    """A JSON file holding the list of choices (see resolve_choices)."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise GrammarError(f"cannot read the choices file {str(path)!r}: {exc}") from exc
    return resolve_choices(raw, fmt)


def has_tool_result(messages: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a tool already ran in this conversation (choices mode: the choice was made)."""
    return any(m.get("role") == "tool" for m in messages)
