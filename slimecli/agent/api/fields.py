"""Request fields the adapters read the same way: text blocks, integer limits, strings the reply echoes, the tool
list. Every violation is an ApiError 400 naming the field; types and bounds go through the one decoder."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from slimecli.agent.api.render import tool_schema
from slimecli.config.decode import NO_SPEC, REQUEST, Spec, decode_value, message
from slimecli.config.errors import FieldError


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str | None = None, retry: bool | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        # SDK-based CLIs honour x-should-retry: a closed or exhausted session must end the run, not back off.
        self.headers = {} if retry is None else {"x-should-retry": "true" if retry else "false"}


MAX_ECHO = 256  # characters of a request string the reply echoes (a model name)


def echoed(body: dict[str, Any], key: str, default: str) -> str:
    """A string field the reply echoes (`model`), checked now so that no event can fail to encode later."""
    value = body.get(key)
    if value is None:
        return default
    value = _decoded(value, str, key, NO_SPEC)
    if len(value) > MAX_ECHO:
        raise ApiError(400, f"`{key}` is longer than {MAX_ECHO} characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"`{key}` is not valid Unicode (it has a lone surrogate)") from None
    return value


def text_of(content: Any, what: str) -> str:
    """Flatten a string or a list of text-like blocks; images and documents become placeholders."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{what} must be a string or a list of blocks")
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
            continue
        if not isinstance(block, dict):
            raise ApiError(400, f"{what}: each block must be an object")
        kind = block.get("type")
        if kind in ("text", "input_text", "output_text", "reasoning_text", "summary_text"):
            if not isinstance(block.get("text"), str):
                raise ApiError(400, f"{what}: a {kind} block needs a string `text`")
            parts.append(block["text"])
        elif kind in ("image", "input_image"):
            parts.append("[image]")
        elif kind in ("document", "input_file"):
            parts.append("[document]")
    return "\n".join(parts)


def tools_of(raw: Any, offered: Callable[[dict[str, Any]], bool], schema_key: str) -> list[dict[str, Any]]:
    """`tools`: a list of objects; those `offered` to the local model (not the API's server-side or deferred tools)
    need a string `name` and become chat-template tools with the JSON schema under `schema_key`."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ApiError(400, "`tools` must be a list")
    tools = []
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict):
            raise ApiError(400, f"tools.{i} must be an object")
        if not offered(tool):
            continue
        if not isinstance(tool.get("name"), str):
            raise ApiError(400, f"tools.{i}: a tool needs a string `name`")
        description = tool.get("description")
        tools.append(tool_schema(tool["name"], description if isinstance(description, str) else "",
                                 tool.get(schema_key)))
    return tools


def int_field(body: dict[str, Any], key: str, minimum: int = 1) -> int | None:
    value = body.get(key)
    return None if value is None else _decoded(value, int, key, Spec(ge=minimum))  # type: ignore[no-any-return]


def _decoded(value: Any, tp: Any, key: str, fs: Spec) -> Any:
    """One field through the decoder; an ApiError 400 naming it."""
    errors: list[FieldError] = []
    out = decode_value(value, tp, key, errors, fs, REQUEST)
    if errors:
        raise ApiError(400, message(errors))
    return out
