"""Anthropic Messages API adapter (agent=claude_code): /v1/messages (streaming and not) and count_tokens.

A streamed reply is streamed as it is sampled (slimecli.agent.api.streaming): message_start and a ping when the
engine's first chunk arrives, a thinking block once the reasoning is complete, text_delta events as the text
comes, tool_use blocks (one input_json_delta each) when the turn ends, then message_delta and message_stop. A
failure after the stream opened is an `error` event (overloaded_error for an aborted turn: the CLI retries)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from slimecli.agent.api.adapter import Adapter, ApiError, TurnRequest, TurnResult, new_id, send_json
from slimecli.agent.api.fields import echoed, int_field, text_of, tools_of
from slimecli.agent.api.streaming import LiveText, sse_event
from slimecli.model.tool_grammar import ToolChoice

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
               415: "invalid_request_error", 429: "rate_limit_error", 503: "overloaded_error"}
SIGNATURE = "slimecli-local"  # thinking blocks need a signature field; the local model has nothing to sign


class AnthropicAdapter(Adapter):
    name = "anthropic"

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/v1/messages", self._messages), web.post("/v1/messages/count_tokens", self._count)]

    def error_body(self, status: int, message: str, kind: str | None) -> dict[str, Any]:
        return {"type": "error", "error": {"type": kind or ERROR_TYPES.get(status, "api_error"), "message": message}}

    async def _count(self, request: web.Request) -> web.StreamResponse:
        body = await self.read_json(request)
        req = to_turn_request(body, need_max_tokens=False)
        return web.json_response({"input_tokens": len(await self.render(req))})

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        sid = self.session_id(request)
        body = await self.read_json(request)
        req = to_turn_request(body, need_max_tokens=True)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise ApiError(400, "`stream` must be a boolean")
        model = echoed(body, "model", self.settings.model_name)
        if stream:
            return await self.stream_turn(request, sid, req, _MessageStream(model, self.error_body))

        async def send(request: web.Request, result: TurnResult) -> web.StreamResponse:
            return await send_json(request, {
                "id": new_id("msg_"), "type": "message", "role": "assistant", "model": model,
                "content": content_blocks(result), "stop_reason": stop_reason(result),
                "stop_sequence": result.stop_sequence, "usage": usage(result)})

        return await self.serve_turn(request, sid, req, send)


class _MessageStream:
    """The events of one streamed message (a StreamWriter); blocks are numbered in the order they open."""

    def __init__(self, model: str, error_body: Any) -> None:
        self.model = model
        self.error_body = error_body
        self.index = 0
        self.text_index: int | None = None  # the open text block

    def opening(self, prompt_len: int) -> list[bytes]:
        start: dict[str, Any] = {"id": new_id("msg_"), "type": "message", "role": "assistant", "model": self.model,
                                 "content": [], "stop_reason": None, "stop_sequence": None,
                                 "usage": {"input_tokens": prompt_len, "output_tokens": 0}}
        return [sse_event("message_start", {"type": "message_start", "message": start}), *self.keepalive()]

    def keepalive(self) -> list[bytes]:
        return [sse_event("ping", {"type": "ping"})]

    def reasoning(self, text: str) -> list[bytes]:
        return self._block({"type": "thinking", "thinking": text, "signature": SIGNATURE}) if text else []

    def text(self, delta: str) -> list[bytes]:
        events = []
        if self.text_index is None:
            self.text_index = self.index
            self.index += 1
            events.append(_start(self.text_index, {"type": "text", "text": ""}))
        if delta:
            events.append(_delta(self.text_index, {"type": "text_delta", "text": delta}))
        return events

    def finish(self, result: TurnResult, live: LiveText) -> list[bytes]:
        parsed = result.parsed
        reasoning, rest = live.rest(parsed)
        events = self.reasoning(reasoning)
        if rest or (self.text_index is None and (parsed.text or not parsed.tool_calls)):
            events += self.text(rest)
        if self.text_index is not None:
            events.append(_stop(self.text_index))
        for call in parsed.tool_calls:
            events += self._block({"type": "tool_use", "id": new_id("toolu_"), "name": call.name,
                                   "input": call.arguments})
        events.append(sse_event("message_delta", {
            "type": "message_delta", "delta": {"stop_reason": stop_reason(result),
                                               "stop_sequence": result.stop_sequence},
            "usage": {"output_tokens": len(result.gen.output_ids)}}))
        events.append(sse_event("message_stop", {"type": "message_stop"}))
        return events

    def failure(self, status: int, message: str) -> list[bytes]:
        return [sse_event("error", self.error_body(status, message, None))]

    def _block(self, block: dict[str, Any]) -> list[bytes]:
        index = self.index
        self.index += 1
        return _block_events(index, block)


def _start(index: int, block: dict[str, Any]) -> bytes:
    return sse_event("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})


def _delta(index: int, delta: dict[str, Any]) -> bytes:
    return sse_event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def _stop(index: int) -> bytes:
    return sse_event("content_block_stop", {"type": "content_block_stop", "index": index})


def _block_events(index: int, block: dict[str, Any]) -> list[bytes]:
    kind = block["type"]
    start: dict[str, Any]
    if kind == "text":
        start, deltas = {"type": "text", "text": ""}, [{"type": "text_delta", "text": block["text"]}]
    elif kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": block["thinking"]},
                  {"type": "signature_delta", "signature": block["signature"]}]
    else:
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}]
    events = [_start(index, start)]
    events += [_delta(index, d) for d in deltas if any(v for k, v in d.items() if k != "type")]
    events.append(_stop(index))
    return events


def content_blocks(result: TurnResult) -> list[dict[str, Any]]:
    parsed = result.parsed
    blocks: list[dict[str, Any]] = []
    if parsed.reasoning:
        blocks.append({"type": "thinking", "thinking": parsed.reasoning, "signature": SIGNATURE})
    if parsed.text or not parsed.tool_calls:
        blocks.append({"type": "text", "text": parsed.text})
    for call in parsed.tool_calls:
        blocks.append({"type": "tool_use", "id": new_id("toolu_"), "name": call.name, "input": call.arguments})
    return blocks


def stop_reason(result: TurnResult) -> str:
    if result.parsed.tool_calls:
        return "tool_use"
    if result.stop_sequence is not None:
        return "stop_sequence"
    return "max_tokens" if result.truncated else "end_turn"


def usage(result: TurnResult) -> dict[str, int]:
    return {"input_tokens": len(result.prompt_ids), "output_tokens": len(result.gen.output_ids),
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


# --- request -> chat messages ---------------------------------------------------------------------------

def to_turn_request(body: dict[str, Any], need_max_tokens: bool) -> TurnRequest:
    max_tokens = int_field(body, "max_tokens")
    if need_max_tokens and max_tokens is None:
        raise ApiError(400, "`max_tokens` is required")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "`messages` must be a non-empty list")
    messages: list[dict[str, Any]] = []
    system = text_of(body.get("system"), "system")
    if system:
        messages.append({"role": "system", "content": system})
    for i, message in enumerate(raw):
        messages.extend(_translate(message, f"messages.{i}"))
    stop = body.get("stop_sequences") or []
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, "`stop_sequences` must be a list of non-empty strings")
    tools = tools_of(body.get("tools"), _offered, "input_schema")
    return TurnRequest(messages, tools, max_tokens, stop, tool_choice(body.get("tool_choice")))


def tool_choice(raw: Any) -> ToolChoice:
    """`{"type": "auto"|"any"|"tool"|"none", "name": ..., "disable_parallel_tool_use": bool}` (auto if absent)."""
    if raw is None:
        return ToolChoice()
    if not isinstance(raw, dict) or raw.get("type") not in ("auto", "any", "tool", "none"):
        raise ApiError(400, "`tool_choice` must be an object with type auto, any, tool or none")
    single = raw.get("disable_parallel_tool_use", False)
    if not isinstance(single, bool):
        raise ApiError(400, "`tool_choice.disable_parallel_tool_use` must be a boolean")
    kind = raw["type"]
    if kind == "tool":
        if not isinstance(raw.get("name"), str) or not raw["name"]:
            raise ApiError(400, "`tool_choice` of type tool needs a string `name`")
        return ToolChoice("required", (raw["name"],), not single)
    return ToolChoice({"auto": "auto", "any": "required", "none": "none"}[kind], None, not single)


def _translate(message: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(message, dict):
        raise ApiError(400, f"{where} must be an object")
    role, content = message.get("role"), message.get("content")
    if role not in ("user", "assistant", "system"):
        raise ApiError(400, f"{where}.role must be user or assistant")
    if not isinstance(content, str | list):
        raise ApiError(400, f"{where}.content must be a string or a list of blocks")
    if isinstance(content, str) or role == "system":
        return [{"role": role, "content": text_of(content, f"{where}.content")}]
    if not all(isinstance(b, dict) for b in content):
        raise ApiError(400, f"{where}.content: each block must be an object")
    if role == "assistant":
        return [_assistant(content, where)]
    tools = [{"role": "tool", "tool_call_id": _tool_result_id(b, where), "content": _tool_result_text(b, where)}
             for b in content if b.get("type") == "tool_result"]
    rest = [b for b in content if b.get("type") != "tool_result"]
    out = list(tools)
    if rest or not tools:
        out.append({"role": "user", "content": text_of(rest, f"{where}.content")})
    return out


def _assistant(content: list[dict[str, Any]], where: str) -> dict[str, Any]:
    texts, reasoning, calls = [], [], []
    for block in content:
        kind = block.get("type")
        if kind == "text":
            texts.append(text_of([block], where))
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise ApiError(400, f"{where}: a thinking block needs a string `thinking`")
            reasoning.append(block["thinking"])
        elif kind == "tool_use":
            name, args = block.get("name"), block.get("input", {})
            if not isinstance(name, str) or not isinstance(args, dict):
                raise ApiError(400, f"{where}: tool_use needs a string `name` and an object `input`")
            calls.append({"id": str(block.get("id", "")), "type": "function",
                          "function": {"name": name, "arguments": args}})
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if reasoning:
        message["reasoning_content"] = "\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_result_id(block: dict[str, Any], where: str) -> str:
    tid = block.get("tool_use_id")
    if not isinstance(tid, str):
        raise ApiError(400, f"{where}: tool_result needs a string `tool_use_id`")
    return tid


def _tool_result_text(block: dict[str, Any], where: str) -> str:
    return text_of(block.get("content"), f"{where}.tool_result.content")


def _offered(tool: dict[str, Any]) -> bool:
    """Client tools; server tools (web search, ...) and deferred ones are not offered to the local model."""
    return tool.get("type") in (None, "custom") and tool.get("defer_loading") is not True
