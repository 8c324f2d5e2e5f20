"""Streaming a turn to the CLI while the engine samples it: which text is safe to show, and the SSE plumbing.

The rule (the reply must not change because it was streamed): every delta sent is a prefix of what the finished
turn's parse gives, so the streamed reply and the non-streamed one are the same blocks with the same text.
- Text is shown as the engine produces it, minus a tail that could still change its meaning: the start of a stop
  sequence of the request (stripped when matched), an incomplete UTF-8 character, trailing whitespace (the reply
  text is stripped), and what the tool parser holds back (`stream_view`, see slimecli.model.tool_calls): for the
  Qwen/Hermes layout, a leading `<think>` block until `</think>` arrives (then the reasoning is sent whole) and
  everything from `<tool_call>` on (or a tail that could become one).
- Tool calls are sent when the turn ends: whether a call is well-formed (and so a tool call rather than text) is
  known only then.
- A parser without `stream_view` gets no early text: its reply is sent at the end, in the same stream format.
Each streamed turn is recorded exactly as a non-streamed one: ids and log-probs come from the engine's
finished reply, never from the deltas.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web

from slimecli.model.tool_calls import ParsedOutput, partial_suffix

log = logging.getLogger(__name__)

KEEPALIVE_S = 10.0  # a stream that showed nothing for this long gets the API's keep-alive event, if it has one
STREAM_INTERVAL = 4  # engine chunks every this many tokens (SGLang's stream_interval; the first one at once)

View = Callable[[str], "tuple[str | None, str | None]"]


def sse_event(name: str | None, data: dict[str, Any]) -> bytes:
    head = f"event: {name}\n" if name else ""
    # Everything echoed from a request was checked before the stream opened; "replace" is only a last guard so
    # that an event is never lost to an encoding error mid-stream.
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n".encode("utf-8", "replace")


async def open_sse(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    return response


class StreamWriter(Protocol):
    """One API's events for one streamed turn (each method returns the encoded events to send)."""

    def opening(self, prompt_len: int) -> list[bytes]: ...

    def reasoning(self, text: str) -> list[bytes]: ...

    def text(self, delta: str) -> list[bytes]: ...

    def finish(self, result: Any, live: LiveText) -> list[bytes]: ...

    def failure(self, status: int, message: str) -> list[bytes]: ...

    def keepalive(self) -> list[bytes]: ...


class LiveText:
    """What of the output so far has been shown, and what to show next (see the module's rule)."""

    def __init__(self, view: View | None, stops: list[str], decode: Callable[[list[int]], str]) -> None:
        self.view = view
        self.stops = list(stops)
        self.decode = decode
        self.resolved = False  # whether the reasoning is known (sent, or known to be absent)
        self.reasoning = ""  # the reasoning sent
        self.text = ""  # the text sent

    def update(self, ids: list[int]) -> tuple[str, str]:
        """(reasoning to send now, text delta to send now) for the output ids so far."""
        if self.view is None:
            return "", ""
        raw = self.decode(ids).rstrip("\ufffd")  # an incomplete UTF-8 character decodes as U+FFFD for now
        if self.stops:
            raw = raw[:len(raw) - partial_suffix(raw, self.stops)]
        reasoning, text = self.view(raw)
        if text is None:
            return "", ""
        new_reasoning = ""
        if not self.resolved:
            self.resolved = True
            self.reasoning = new_reasoning = reasoning or ""
        if not text.startswith(self.text):  # cannot happen for a parser that keeps the rule; never unsay text
            return new_reasoning, ""
        delta, self.text = text[len(self.text):], text
        return new_reasoning, delta

    def rest(self, parsed: ParsedOutput) -> tuple[str, str]:
        """(reasoning still to send, text still to send) once the turn is parsed."""
        reasoning = "" if self.resolved else parsed.reasoning
        if self.resolved and parsed.reasoning != self.reasoning:
            log.warning("streamed reasoning differs from the parsed turn's (parser breaks the streaming rule)")
        if not parsed.text.startswith(self.text):
            log.warning("streamed text is not a prefix of the parsed turn's (parser breaks the streaming rule)")
            return reasoning, ""
        return reasoning, parsed.text[len(self.text):]
