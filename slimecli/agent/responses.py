"""OpenAI Responses API adapter (agent=codex): /v1/responses, streaming with the events Codex waits for."""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

from slimecli.agent.adapter import (
    Adapter,
    ApiError,
    TurnRequest,
    TurnResult,
    int_field,
    new_id,
    open_sse,
    send_json,
    sse_event,
    text_of,
)
from slimecli.agent.constrain import ToolChoice
from slimecli.agent.render import tool_schema

ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "not_found",
               413: "invalid_request_error", 415: "invalid_request_error",
               429: "rate_limit_exceeded", 503: "server_is_overloaded"}


class ResponsesAdapter(Adapter):
    name = "responses"

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/v1/responses", self._responses), web.post("/responses", self._responses)]

    def error_body(self, status: int, message: str, kind: str | None) -> dict[str, Any]:
        code = kind or ERROR_TYPES.get(status, "server_error")
        return {"error": {"type": "invalid_request_error" if status < 500 and status != 429 else code,
                          "code": code, "message": message, "param": None}}

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        sid = self.session_id(request)
        body = await self.read_json(request)
        req = to_turn_request(body)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise ApiError(400, "`stream` must be a boolean")
        model = body["model"] if isinstance(body.get("model"), str) else self.settings.model_name

        async def send(request: web.Request, result: TurnResult) -> web.StreamResponse:
            response = response_object(model, result)
            if not stream:
                return await send_json(request, response)
            return await self._stream(request, response)

        return await self.serve_turn(request, sid, req, send)

    async def _stream(self, request: web.Request, response: dict[str, Any]) -> web.StreamResponse:
        resp = await open_sse(request)
        events: list[dict[str, Any]] = []
        pending = {**response, "status": "in_progress", "output": [], "usage": None}
        events.append({"type": "response.created", "response": pending})
        events.append({"type": "response.in_progress", "response": pending})
        for index, item in enumerate(response["output"]):
            events.extend(_item_events(index, item))
        events.append({"type": "response.completed", "response": response})
        chunks = [sse_event(e["type"], {**e, "sequence_number": n}) for n, e in enumerate(events)]
        await resp.write(b"".join(chunks))
        await resp.write_eof()
        return resp


def _item_events(index: int, item: dict[str, Any]) -> list[dict[str, Any]]:
    kind = item["type"]
    empty = {**item, "status": "in_progress"}
    if kind == "message":
        empty["content"] = []
    elif kind == "function_call":
        empty["arguments"] = ""
    events = [{"type": "response.output_item.added", "output_index": index, "item": empty}]
    if kind == "message":
        part = item["content"][0]
        ref = {"item_id": item["id"], "output_index": index, "content_index": 0}
        events.append({"type": "response.content_part.added", **ref, "part": {**part, "text": ""}})
        if part["text"]:
            events.append({"type": "response.output_text.delta", **ref, "delta": part["text"]})
        events.append({"type": "response.output_text.done", **ref, "text": part["text"]})
        events.append({"type": "response.content_part.done", **ref, "part": part})
    elif kind == "function_call":
        ref = {"item_id": item["id"], "output_index": index}
        events.append({"type": "response.function_call_arguments.delta", **ref, "delta": item["arguments"]})
        events.append({"type": "response.function_call_arguments.done", **ref, "arguments": item["arguments"]})
    events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    return events


def response_object(model: str, result: TurnResult) -> dict[str, Any]:
    parsed = result.parsed
    output: list[dict[str, Any]] = []
    if parsed.reasoning:
        output.append({"type": "reasoning", "id": new_id("rs_"), "status": "completed", "summary": [],
                       "content": [{"type": "reasoning_text", "text": parsed.reasoning}],
                       "encrypted_content": parsed.reasoning})
    if parsed.text or not parsed.tool_calls:
        output.append({"type": "message", "id": new_id("msg_"), "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": parsed.text, "annotations": []}]})
    for call in parsed.tool_calls:
        output.append({"type": "function_call", "id": new_id("fc_"), "call_id": new_id("call_"), "name": call.name,
                       "arguments": json.dumps(call.arguments, ensure_ascii=False), "status": "completed"})
    n_in, n_out = len(result.prompt_ids), len(result.gen.output_ids)
    truncated = result.truncated and not parsed.tool_calls
    return {"id": new_id("resp_"), "object": "response", "created_at": int(time.time()), "status": "completed",
            "model": model, "output": output, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
            "usage": {"input_tokens": n_in, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": n_out,
                      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": n_in + n_out}}


# --- request -> chat messages ---------------------------------------------------------------------------

def to_turn_request(body: dict[str, Any]) -> TurnRequest:
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ApiError(400, "`instructions` must be a string")
    if instructions:
        messages.append({"role": "system", "content": instructions})
    raw = body.get("input")
    if isinstance(raw, str):
        raw = [{"type": "message", "role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "`input` must be a string or a non-empty list of items")
    reasoning: list[str] = []
    for i, item in enumerate(raw):
        _add_item(messages, item, f"input.{i}", reasoning)
    if not any(m["role"] != "system" for m in messages):
        raise ApiError(400, "`input` has no user, assistant or tool item")
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, "`stop` must be a string or a list of non-empty strings")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool | None):
        raise ApiError(400, "`parallel_tool_calls` must be a boolean")
    return TurnRequest(messages, _tools(body.get("tools")), int_field(body, "max_output_tokens"), stop,
                       tool_choice(body.get("tool_choice"), parallel is not False))


def tool_choice(raw: Any, parallel: bool = True) -> ToolChoice:
    """"auto" | "required" | "none" | {"type": "function", "name": ...} | {"type": "allowed_tools", "mode":
    "auto"|"required", "tools": [{"type": "function", "name": ...}]}; a hosted tool ({"type": "web_search"},
    ...) is never offered to the local model, so constraining to it is refused when the grammar is built."""
    if raw is None:
        return ToolChoice(parallel=parallel)
    if raw in ("auto", "required", "none"):
        return ToolChoice(raw, None, parallel)
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise ApiError(400, "`tool_choice` must be auto, required, none or an object with a `type`")
    kind = raw["type"]
    if kind == "allowed_tools":
        mode, tools = raw.get("mode", "auto"), raw.get("tools")
        if mode not in ("auto", "required") or not isinstance(tools, list):
            raise ApiError(400, "`tool_choice` allowed_tools needs mode auto or required and a list `tools`")
        names = []
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict) or not isinstance(tool.get("name", tool.get("type")), str):
                raise ApiError(400, f"`tool_choice.tools.{i}` must be an object naming a tool")
            names.append(str(tool.get("name", tool.get("type"))))
        return ToolChoice(mode, tuple(names), parallel)
    name = raw.get("name") if kind in ("function", "custom") else kind
    if not isinstance(name, str) or not name:
        raise ApiError(400, f"`tool_choice` of type {kind} needs a string `name`")
    return ToolChoice("required", (name,), parallel)


def _add_item(messages: list[dict[str, Any]], item: Any, where: str, reasoning: list[str]) -> None:
    if not isinstance(item, dict):
        raise ApiError(400, f"{where} must be an object")
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise ApiError(400, f"{where}.role must be user, assistant, system or developer")
        text = text_of(item.get("content"), f"{where}.content")
        if role == "assistant":
            _assistant(messages, reasoning)["content"] += text
        else:
            messages.append({"role": "system" if role == "developer" else role, "content": text})
    elif kind == "function_call":
        name, args, call_id = item.get("name"), item.get("arguments", "{}"), item.get("call_id")
        if not isinstance(name, str) or not isinstance(args, str) or not isinstance(call_id, str):
            raise ApiError(400, f"{where}: function_call needs string `name`, `arguments` and `call_id`")
        last = messages[-1] if messages and not reasoning else None
        target = last if last is not None and last["role"] == "assistant" else _assistant(messages, reasoning)
        target.setdefault("tool_calls", []).append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}})
    elif kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            raise ApiError(400, f"{where}: function_call_output needs a string `call_id`")
        output = item.get("output")
        text = output if isinstance(output, str) else text_of(output, f"{where}.output")
        messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
    elif kind == "reasoning":
        parts = item.get("content") or item.get("summary") or []
        text = text_of(parts, f"{where}.content") if isinstance(parts, list) else ""
        if not text and isinstance(item.get("encrypted_content"), str):
            text = item["encrypted_content"]
        if text:
            reasoning.append(text)
    # other item types (web_search_call, local_shell_call, custom tool calls, ...) are not ours: skipped


def _assistant(messages: list[dict[str, Any]], reasoning: list[str]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    if reasoning:
        message["reasoning_content"] = "\n".join(reasoning)
        reasoning.clear()
    messages.append(message)
    return message


def _tools(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ApiError(400, "`tools` must be a list")
    tools = []
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict):
            raise ApiError(400, f"tools.{i} must be an object")
        if tool.get("type") != "function":
            continue  # custom, local_shell, web_search, namespace...: not offered to the local model
        if not isinstance(tool.get("name"), str):
            raise ApiError(400, f"tools.{i}: a function tool needs a string `name`")
        description = tool.get("description")
        tools.append(tool_schema(tool["name"], description if isinstance(description, str) else "",
                                 tool.get("parameters")))
    return tools
