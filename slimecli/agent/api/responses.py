"""OpenAI Responses API adapter (agent=codex): /v1/responses, streaming with the events Codex waits for.

A streamed reply is streamed as it is sampled (slimecli.agent.api.streaming): response.created and
response.in_progress when the engine's first chunk arrives, a reasoning item once the reasoning is complete, the
message item's response.output_text.delta events as the text comes, function_call items when the turn ends, then
response.completed. A reply cut by max_output_tokens (or by the context window) is `status: "incomplete"` with
`incomplete_details: {"reason": "max_output_tokens"}`, and its stream ends with response.incomplete (see
INCOMPLETE). A failure after the stream opened is response.failed."""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

from slimecli.agent.api.adapter import Adapter, ApiError, TurnRequest, TurnResult, new_id, send_json
from slimecli.agent.api.fields import echoed, int_field, text_of, tools_of
from slimecli.agent.api.streaming import LiveText, sse_event
from slimecli.model.tool_grammar import ToolChoice

# A reply cut by the length limit the client asked for (or by the context window) is "incomplete", as the
# Responses API marks it.
INCOMPLETE = True
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
        model = echoed(body, "model", self.settings.model_name)
        if stream:
            return await self.stream_turn(request, sid, req, _ResponseStream(model))

        async def send(request: web.Request, result: TurnResult) -> web.StreamResponse:
            return await send_json(request, response_object(model, result))

        return await self.serve_turn(request, sid, req, send)


class _ResponseStream:
    """The events of one streamed response (a StreamWriter), numbered by sequence_number."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.ids = {"resp": new_id("resp_"), "msg": new_id("msg_"), "rs": new_id("rs_")}
        self.seq = 0
        self.index = 0  # output_index of the next item
        self.message_index: int | None = None  # the message item, once added

    def _events(self, *events: dict[str, Any]) -> list[bytes]:
        out = []
        for event in events:
            out.append(sse_event(event["type"], {**event, "sequence_number": self.seq}))
            self.seq += 1
        return out

    def opening(self, prompt_len: int) -> list[bytes]:
        pending = {"id": self.ids["resp"], "object": "response", "created_at": int(time.time()),
                   "status": "in_progress", "model": self.model, "output": [], "error": None,
                   "incomplete_details": None, "usage": None}
        return self._events({"type": "response.created", "response": pending},
                            {"type": "response.in_progress", "response": pending})

    def keepalive(self) -> list[bytes]:
        return []  # the Responses stream has no keep-alive event

    def reasoning(self, text: str) -> list[bytes]:
        if not text:
            return []
        index, self.index = self.index, self.index + 1
        return self._events(*_item_events(index, reasoning_item(self.ids["rs"], text)))

    def _message_ref(self) -> dict[str, Any]:
        return {"item_id": self.ids["msg"], "output_index": self.message_index, "content_index": 0}

    def text(self, delta: str) -> list[bytes]:
        events = []
        if self.message_index is None:
            self.message_index, self.index = self.index, self.index + 1
            empty = {**message_item(self.ids["msg"], ""), "status": "in_progress", "content": []}
            events += [{"type": "response.output_item.added", "output_index": self.message_index, "item": empty},
                       {"type": "response.content_part.added", **self._message_ref(),
                        "part": {"type": "output_text", "text": "", "annotations": []}}]
        if delta:
            events.append({"type": "response.output_text.delta", **self._message_ref(), "delta": delta})
        return self._events(*events)

    def finish(self, result: TurnResult, live: LiveText) -> list[bytes]:
        response = response_object(self.model, result, self.ids)
        reasoning, rest = live.rest(result.parsed)
        out = self.reasoning(reasoning)
        items = [i for i in response["output"] if i["type"] != "reasoning"]
        if items and items[0]["type"] == "message":
            message = items.pop(0)
            out += self.text(rest)
            part, ref = message["content"][0], self._message_ref()
            out += self._events({"type": "response.output_text.done", **ref, "text": part["text"]},
                                {"type": "response.content_part.done", **ref, "part": part},
                                {"type": "response.output_item.done", "output_index": self.message_index,
                                 "item": message})
        for item in items:
            index, self.index = self.index, self.index + 1
            out += self._events(*_item_events(index, item))
        return out + self._events({"type": f"response.{response['status']}", "response": response})

    def failure(self, status: int, message: str) -> list[bytes]:
        code = "server_is_overloaded" if status == 503 else "server_error"
        failed: dict[str, Any] = {"id": self.ids["resp"], "object": "response", "status": "failed", "model": self.model,
                  "output": [], "error": {"code": code, "message": message}, "incomplete_details": None,
                  "usage": None}
        return self._events({"type": "response.failed", "response": failed})


def _item_events(index: int, item: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of one whole output item (reasoning or function_call)."""
    kind = item["type"]
    empty = {**item, "status": "in_progress"}
    if kind == "function_call":
        empty["arguments"] = ""
    events = [{"type": "response.output_item.added", "output_index": index, "item": empty}]
    if kind == "function_call":
        ref = {"item_id": item["id"], "output_index": index}
        events.append({"type": "response.function_call_arguments.delta", **ref, "delta": item["arguments"]})
        events.append({"type": "response.function_call_arguments.done", **ref, "arguments": item["arguments"]})
    events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    return events


def reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "status": "completed", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "encrypted_content": text}


def message_item(item_id: str, text: str) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def response_object(model: str, result: TurnResult, ids: dict[str, str] | None = None) -> dict[str, Any]:
    ids = ids or {"resp": new_id("resp_"), "msg": new_id("msg_"), "rs": new_id("rs_")}
    parsed = result.parsed
    output: list[dict[str, Any]] = []
    if parsed.reasoning:
        output.append(reasoning_item(ids["rs"], parsed.reasoning))
    if parsed.text or not parsed.tool_calls:
        output.append(message_item(ids["msg"], parsed.text))
    for call in parsed.tool_calls:
        output.append({"type": "function_call", "id": new_id("fc_"), "call_id": new_id("call_"), "name": call.name,
                       "arguments": json.dumps(call.arguments, ensure_ascii=False), "status": "completed"})
    n_in, n_out = len(result.prompt_ids), len(result.gen.output_ids)
    incomplete = result.truncated and not parsed.tool_calls and INCOMPLETE
    return {"id": ids["resp"], "object": "response", "created_at": int(time.time()),
            "status": "incomplete" if incomplete else "completed", "model": model, "output": output, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
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
    tools = tools_of(body.get("tools"), _function, "parameters")
    return TurnRequest(messages, tools, int_field(body, "max_output_tokens"), stop,
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


def _function(tool: dict[str, Any]) -> bool:
    """Function tools; custom, local_shell, web_search, namespace...: not offered to the local model."""
    return tool.get("type") == "function"
