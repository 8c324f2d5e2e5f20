"""Hostile input against both adapters, property-based and seeded (complements test_agent_fuzz.py's mutation
fuzz): bodies of random JSON in every field (wrong types, huge and negative numbers, NaN, deep nesting, lone
surrogates), random bytes, unknown paths and methods, and clients that drop the connection mid-stream. Every
answer is below 500 (a 4xx in the API's error format, or a complete stream), the server never dies, and a valid
request succeeds afterwards."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from test_agent_adapters import WRITE_TOOL, anthropic_body, responses_body, tokenizer

from slimecli.agent.api.anthropic import AnthropicAdapter
from slimecli.agent.api.responses import ResponsesAdapter
from tests.helpers.scripted_engine import Stack
from tests.helpers.streaming_engine import StreamingEngine

HOSTILE = settings(max_examples=120, deadline=None, derandomize=True,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
SURROGATES = ["\ud800", "\udfff", "a\ud83d", "\udc00b"]
ENDINGS = {"anthropic": {"message_stop", "error"},
           "responses": {"response.completed", "response.incomplete", "response.failed"}}


class Served:
    """One adapter + the streaming test engine, served from a background event loop."""

    def __init__(self, adapter_cls: type) -> None:
        self.kind = adapter_cls.name
        self.path = "/v1/messages" if adapter_cls is AnthropicAdapter else "/v1/responses"
        self.valid = (anthropic_body([{"role": "user", "content": "hi"}], stream=True) if adapter_cls is
                      AnthropicAdapter else responses_body("hi"))
        self.loop = asyncio.new_event_loop()
        self.stack = Stack(adapter_cls, tokenizer(), [], context_len=4096, max_turns=10**9, max_body_bytes=1 << 20)
        self.stack.engine = StreamingEngine(tokenizer(), [])
        self.stack.engine.fallback = "A short and harmless reply of several words."
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.stack.__aenter__(), self.loop).result(60)
        self.port = int(self.stack.url.rsplit(":", 1)[1])
        self.statuses: Counter[int] = Counter()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.stack.__aexit__(None, None, None), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def request(self, method: str, path: str, body: bytes | None, headers: dict[str, str] | None = None
                ) -> tuple[int, bytes, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request(method, path, body=body, headers={"x-api-key": "hostile", "authorization": "Bearer hostile",
                                                           "content-type": "application/json", **(headers or {})})
            resp = conn.getresponse()
            return resp.status, resp.read(), resp.getheader("content-type", "")
        finally:
            conn.close()

    def check(self, status: int, raw: bytes, ctype: str) -> None:
        """Below 500; an error is JSON in the API's format; a stream ends with one of the API's final events."""
        self.statuses[status] += 1
        assert status < 500, (status, raw[:500])
        if status >= 400:
            err = json.loads(raw)
            assert "error" in err and isinstance(err["error"], dict) and err["error"]["message"], raw[:300]
        elif ctype.startswith("text/event-stream"):
            raw.decode("utf-8")  # every event encodes
            events = [e for e in raw.decode().split("\n\n") if e.strip()]
            last = json.loads(events[-1].split("data: ", 1)[1])
            assert last["type"] in ENDINGS[self.kind], events[-1][:300]

    def still_serves(self) -> None:
        status, raw, ctype = self.request("POST", self.path, json.dumps(self.valid).encode())
        assert status == 200, raw[:500]
        self.check(status, raw, ctype)
        assert not raw.decode().rstrip().endswith("error") and b"message" in raw


@pytest.fixture(scope="module", params=[AnthropicAdapter, ResponsesAdapter], ids=["anthropic", "responses"])
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    s = Served(request.param)
    yield s
    s.still_serves()  # a valid request succeeds after everything the module sent
    s.close()
    assert s.statuses[200] and s.statuses[400] and max(s.statuses) < 500, s.statuses  # both sides were hit


def json_values(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.sampled_from([2**64, -2**63, 10**30, -1, 0]),
                       st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
                       st.sampled_from(SURROGATES))
    return st.recursive(leaves, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                        max_leaves=max_leaves)


def fields(kind: str) -> list[str]:
    body = anthropic_body([{"role": "user", "content": "hi"}]) if kind == "anthropic" else responses_body("hi")
    return sorted(body) + ["max_output_tokens", "stop", "stop_sequences", "temperature", "tool_choice", "input",
                           "messages", "system", "instructions", "model", "stream"]


@HOSTILE
@given(data=st.data())
def test_random_values_in_every_field(served: Served, data: st.DataObject) -> None:
    body = dict(served.valid)
    for key in data.draw(st.lists(st.sampled_from(fields(served.kind)), min_size=1, max_size=4, unique=True)):
        if data.draw(st.booleans()) and key in body:
            del body[key]
        else:
            body[key] = data.draw(json_values())
    raw = json.dumps(body, allow_nan=True).encode()  # NaN / Infinity as Python writes them (not JSON)
    served.check(*served.request("POST", served.path, raw))


@HOSTILE
@given(data=st.data())
def test_hostile_messages_and_items(served: Served, data: st.DataObject) -> None:
    """Valid envelope, hostile conversation: blocks of every type with junk in them."""
    block = st.fixed_dictionaries({"type": st.sampled_from(["text", "tool_use", "tool_result", "thinking", "image",
                                                            "input_text", "output_text", "function_call",
                                                            "function_call_output", "reasoning", "message"])},
                                  optional={k: json_values(6) for k in ("text", "content", "input", "name", "id",
                                                                        "tool_use_id", "call_id", "arguments",
                                                                        "output", "role", "thinking")})
    items = data.draw(st.lists(block, min_size=1, max_size=5))
    body = dict(served.valid)
    if served.kind == "anthropic":
        role = data.draw(st.sampled_from(["user", "assistant", "system", "tool", "x"]))
        body["messages"] = [{"role": role, "content": items}]
    else:
        body["input"] = items
    body["tools"] = data.draw(st.sampled_from([[WRITE_TOOL], [{"name": "\ud800"}], [{"type": "function"}], []]))
    served.check(*served.request("POST", served.path, json.dumps(body, allow_nan=True).encode()))


@HOSTILE
@given(raw=st.one_of(st.binary(max_size=300),
                     st.integers(1, 5000).map(lambda n: b"[" * n + b"]" * n),
                     st.integers(60, 2000).map(lambda n: b'{"max_tokens": ' + b"9" * n + b"}"),
                     st.sampled_from([b"NaN", b'{"model": NaN}', b'{"a": "\\ud800"}', b"\xef\xbb\xbf{}",
                                      b'{"model": "x"' + b", " * 10000 + b"}"]),
                     st.integers(70, 500).map(lambda n: b'{"a": ' + b'{"b": ' * n + b"1" + b"}" * n + b"}")))
def test_malformed_bytes(served: Served, raw: bytes) -> None:
    served.check(*served.request("POST", served.path, raw))


@HOSTILE
@given(method=st.sampled_from(["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "POST", "TRACE"]),
       path=st.one_of(st.sampled_from(["/v1/messages", "/v1/responses", "/responses", "/v1/messages/count_tokens",
                                       "/healthz", "/", "/v1", "/v1/messages/../../etc/passwd", "/%00", "/%ff"]),
                      st.text(alphabet="abc/%.-_~0123456789", max_size=40).map(lambda p: "/" + p)))
def test_unknown_paths_and_methods(served: Served, method: str, path: str) -> None:
    status, raw, ctype = served.request(method, path, b"{}" if method in ("POST", "PUT", "PATCH") else None)
    served.check(status, raw, ctype)


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck),
          phases=[Phase.explicit, Phase.generate])
@given(keep=st.integers(0, 4000))
def test_clients_that_drop_mid_request_or_mid_stream(served: Served, keep: int) -> None:
    """Send a valid streaming request, read `keep` bytes of the answer (or stop sending the body), hang up."""
    body = json.dumps(served.valid).encode()
    head = (f"POST {served.path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nx-api-key: dropper\r\n"
            f"Authorization: Bearer dropper\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as sock:
        if keep % 3 == 0:
            sock.sendall(head + body[:keep % len(body)])  # a body cut short
        else:
            sock.sendall(head + body)
            got = b""
            while len(got) < keep:
                piece = sock.recv(4096)
                if not piece:
                    break
                got += piece
            assert got == b"" or got.startswith(b"HTTP/1.1 200"), got[:200]
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
    served.still_serves()


@pytest.mark.parametrize("adapter_cls", [AnthropicAdapter, ResponsesAdapter], ids=["anthropic", "responses"])
def test_stalled_request_heads_are_closed_and_the_adapter_keeps_serving(adapter_cls: type) -> None:
    """How `agent serve` and training serve an adapter (service.serve_app): a client that sends part of its
    request head and stalls is disconnected by the server; others are served meanwhile and after."""
    from slimecli.agent.api.service import serve_app

    async def main() -> None:
        async with Stack(adapter_cls, tokenizer(), []) as st:
            runner = await serve_app(st.adapter.app(), "127.0.0.1", 0, read_timeout_s=1.0)
            port = runner.addresses[0][1]
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Le")  # and nothing more
                await writer.drain()
                async with asyncio.timeout(60):  # a bound for the test, not a measurement
                    await reader.read()  # returns once the server has closed the connection
                assert reader.at_eof()
                writer.close()
                valid = (anthropic_body([{"role": "user", "content": "hi"}]) if adapter_cls is AnthropicAdapter
                         else responses_body("hi", stream=False))
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                body = json.dumps(valid).encode()
                writer.write(b"POST " + (b"/v1/messages" if adapter_cls is AnthropicAdapter else b"/v1/responses") +
                             b" HTTP/1.1\r\nHost: x\r\nx-api-key: k\r\nConnection: close\r\nContent-Type: "
                             b"application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                async with asyncio.timeout(60):
                    reply = await reader.read()
                assert reply.startswith(b"HTTP/1.1 200"), reply[:300]
                writer.close()
            finally:
                await runner.cleanup()

    asyncio.run(main())
