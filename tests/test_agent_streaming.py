"""Streamed turns: the adapters forward the engine's tokens as they are sampled, show only text the finished
turn keeps (the streaming rule of slimecli.agent.api.streaming), and record exactly what a non-streamed turn records."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_agent_adapters import anthropic_body, call, post, responses_body, sse, tokenizer

from slimecli.agent.api.anthropic import AnthropicAdapter
from slimecli.agent.api.responses import ResponsesAdapter
from slimecli.agent.api.streaming import LiveText
from slimecli.config.groups.agent import AgentConfig
from slimecli.config.groups.rollout import RolloutConfig
from slimecli.model.tool_calls import HermesToolParser
from slimecli.rollout.sample import Sample
from tests.helpers.scripted_engine import Stack
from tests.helpers.streaming_engine import StreamingEngine

LONG = "The quick brown fox jumps over the lazy dog, and then it runs far away into the green hills."


def stack(adapter_cls: type, script: list[Any], incremental: bool = False, **kw: Any) -> Stack:
    s = Stack(adapter_cls, tokenizer(), script, **kw)
    s.engine = StreamingEngine(tokenizer(), script, incremental=incremental)
    return s


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def anthropic_text(events: list[tuple[str | None, dict]]) -> dict[int, str]:
    """Per content block: the text its deltas add up to."""
    out: dict[int, str] = {}
    for name, data in events:
        if name == "content_block_delta":
            d = data["delta"]
            piece = d.get("text", d.get("thinking", d.get("partial_json", "")))
            out[data["index"]] = out.get(data["index"], "") + piece
    return out


async def sample_of(st: Stack, sid: str) -> Sample:
    [s] = await st.manager.finish_session(sid, Sample(prompt="p"), 0.0)
    return s


def same_record(a: Sample, b: Sample) -> None:
    assert (a.tokens, a.loss_mask, a.rollout_log_probs, a.response_length, a.response, a.status) == \
        (b.tokens, b.loss_mask, b.rollout_log_probs, b.response_length, b.response, b.status)


# --- the streaming rule, as a property -------------------------------------------------------------------

FRAGMENTS = ["<think>", "</think>", "<tool_call>", "</tool_call>", '\n{"name": "f", "arguments": {"a": 1}}\n',
             "{bad", " ", "\n", "x", "Hello", "<", "</", "<tool", "END", "EN", "\ufffd", "é"]


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=12), st.sampled_from([[], ["END"], ["END", "<x"]]))
def test_streamed_text_is_always_a_prefix_of_the_final_reply(parts: list[str], stops: list[str]) -> None:
    """Every delta LiveText sends, for every cut of the output, adds up to a prefix of the parsed reply; the
    rest sent at the end completes it exactly (ids here are characters, decoded by joining them)."""
    parser = HermesToolParser()
    text = "".join(parts)
    final = text
    matched = next((s for s in stops if s in text), None)
    if matched is not None:  # the engine stops at the stop string; the adapter strips it when it ends the text
        final = text[:text.index(matched) + len(matched)]
        text = final
        final = final[:-len(matched)]
    parsed = parser.parse(final)
    live = LiveText(parser.stream_view, stops, lambda ids: "".join(map(chr, ids)))
    shown, reasoning = "", ""
    for n in range(len(text) + 1):
        r, delta = live.update([ord(c) for c in text[:n]])
        reasoning += r
        shown += delta
        assert parsed.text.startswith(shown), (text[:n], shown, parsed.text)
    r, rest = live.rest(parsed)
    assert shown + rest == parsed.text and (reasoning or r) == parsed.reasoning


# --- Anthropic ---------------------------------------------------------------------------------------------

def test_anthropic_streams_text_as_it_is_sampled_and_records_the_same_turn():
    async def main():
        async with stack(AnthropicAdapter, [{"text": LONG, "gate": True}, LONG]) as st, \
                aiohttp.ClientSession() as http:
            body = anthropic_body(user("hi"), stream=True)
            async with http.post(f"{st.url}/v1/messages", json=body, headers={"x-api-key": "streamed"}) as r:
                assert r.status == 200
                seen = b""
                while b"text_delta" not in seen:  # the first tokens arrive while the engine still holds the rest
                    seen += await r.content.readany()
                assert b"message_stop" not in seen and not st.engine.gate.is_set()
                st.engine.release()
                events = sse((seen + await r.content.read()).decode())
            names = [n for n, _ in events]
            assert names[:3] == ["message_start", "ping", "content_block_start"] and names[-1] == "message_stop"
            deltas = [d for n, d in events if n == "content_block_delta"]
            assert len(deltas) > 3 and all(d["delta"]["type"] == "text_delta" for d in deltas)
            status, reply, _ = await post(http, f"{st.url}/v1/messages", anthropic_body(user("hi")), key="plain")
            assert status == 200 and anthropic_text(events) == {0: reply["content"][0]["text"]} and \
                reply["content"][0]["text"] == LONG
            assert events[-2][1]["delta"]["stop_reason"] == reply["stop_reason"] == "end_turn"
            assert events[-2][1]["usage"]["output_tokens"] == reply["usage"]["output_tokens"]
            assert [r.get("stream", False) for r in st.engine.requests] == [True, False]
            same_record(await sample_of(st, "streamed"), await sample_of(st, "plain"))
    asyncio.run(main())


def test_anthropic_holds_tool_calls_and_thinking_until_they_are_certain():
    script = ["<think>\nfirst a plan\n</think>\n\nI will write it. " + call("Write", {"file_path": "a.txt"}),
              "Looks like <tool_call>\n{broken\n</tool_call> oops"]
    async def main():
        async with stack(AnthropicAdapter, [t for t in script for _ in (0, 1)]) as st, aiohttp.ClientSession() as http:
            url = f"{st.url}/v1/messages"
            for text in script:
                _, _, raw = await post(http, url, anthropic_body(user(text[:5]), stream=True), key="s")
                _, reply, _ = await post(http, url, anthropic_body(user(text[:5])), key="p")
                events = sse(raw)
                blocks = [d["content_block"] for n, d in events if n == "content_block_start"]
                assert [b["type"] for b in blocks] == [b["type"] for b in reply["content"]]
                streamed = anthropic_text(events)
                for i, block in enumerate(reply["content"]):
                    if block["type"] == "text":
                        assert streamed[i] == block["text"]
                    elif block["type"] == "thinking":
                        assert streamed[i] == block["thinking"] and block["signature"]
                    else:
                        assert json.loads(streamed[i]) == block["input"] and blocks[i]["name"] == block["name"]
                text_deltas = [d["delta"]["text"] for n, d in events if n == "content_block_delta"
                               and d["delta"]["type"] == "text_delta"]
                assert not any("<tool_call>" in t for t in text_deltas[:-1])  # markup only in the final flush
                assert events[-2][1]["delta"]["stop_reason"] == reply["stop_reason"]
            assert [b["type"] for b in reply["content"]] == ["text"]  # the broken call came back as text
    asyncio.run(main())


def test_anthropic_stop_sequence_is_never_shown_and_the_record_matches():
    async def main():
        async with stack(AnthropicAdapter, ["alpha beta END gamma"] * 2) as st, aiohttp.ClientSession() as http:
            url = f"{st.url}/v1/messages"
            _, _, raw = await post(http, url, anthropic_body(user("x"), stream=True, stop_sequences=["END"]), key="s")
            _, reply, _ = await post(http, url, anthropic_body(user("x"), stop_sequences=["END"]), key="p")
            events = sse(raw)
            assert "END" not in json.dumps([d for n, d in events if n == "content_block_delta"])
            assert anthropic_text(events)[0] == reply["content"][0]["text"] == "alpha beta"
            assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
            same_record(await sample_of(st, "s"), await sample_of(st, "p"))
    asyncio.run(main())


def test_anthropic_abort_mid_stream_is_an_error_event_and_records_nothing():
    async def main():
        async with stack(AnthropicAdapter, [{"text": LONG, "abort_after": 4}, "fine"]) as st, \
                aiohttp.ClientSession() as http:
            status, _, raw = await post(http, f"{st.url}/v1/messages", anthropic_body(user("x"), stream=True))
            events = sse(raw)
            assert status == 200 and events[-1][0] == "error"
            assert events[-1][1]["error"]["type"] == "overloaded_error"  # the CLI retries
            status, reply, _ = await post(http, f"{st.url}/v1/messages", anthropic_body(user("x")))
            assert status == 200 and reply["content"][0]["text"] == "fine"
            s = await sample_of(st, "sess")
            assert s.metadata["turns"] == 1
    asyncio.run(main())


def test_a_client_gone_mid_stream_aborts_the_engine_request_and_records_nothing():
    async def main():
        async with stack(AnthropicAdapter, [{"text": LONG, "gate": True}]) as st:
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{st.url}/v1/messages", json=anthropic_body(user("x"), stream=True),
                                     headers={"x-api-key": "gone"}) as r:
                    seen = b""
                    while b"text_delta" not in seen:
                        seen += await r.content.readany()
            # the connection is closed with the engine still generating
            for _ in range(400):
                if st.engine.aborted:
                    break
                await asyncio.sleep(0.05)
            assert st.engine.aborted == [st.engine.requests[0]["rid"]]
            st.engine.release()
            for _ in range(200):
                if not st.manager._sessions["gone"].in_flight:
                    break
                await asyncio.sleep(0.05)
            assert await st.manager.finish_session("gone", Sample(), 0.0) == []
    asyncio.run(main())


def test_incremental_engine_chunks_give_the_same_record():
    """SGLang's incremental streaming output (each chunk has only the new tokens) is assembled as cumulative."""
    async def main():
        async with stack(AnthropicAdapter, [LONG, LONG], incremental=True) as st, aiohttp.ClientSession() as http:
            _, _, raw = await post(http, f"{st.url}/v1/messages", anthropic_body(user("x"), stream=True), key="s")
            _, reply, _ = await post(http, f"{st.url}/v1/messages", anthropic_body(user("x")), key="p")
            assert anthropic_text(sse(raw))[0] == reply["content"][0]["text"] == LONG
            same_record(await sample_of(st, "s"), await sample_of(st, "p"))
    asyncio.run(main())


# --- Responses ---------------------------------------------------------------------------------------------

def test_responses_streams_text_deltas_and_records_the_same_turn():
    async def main():
        script = [LONG, LONG, "<think>\nhm\n</think>\n\n" + call("exec_command", {"cmd": "ls"})]
        async with stack(ResponsesAdapter, script) as st, aiohttp.ClientSession() as http:
            url = f"{st.url}/v1/responses"
            _, _, raw = await post(http, url, responses_body("hi"), key="s")
            _, reply, _ = await post(http, url, responses_body("hi", stream=False), key="p")
            events = sse(raw)
            assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
            deltas = [d for n, d in events if n == "response.output_text.delta"]
            assert len(deltas) > 3 and "".join(d["delta"] for d in deltas) == reply["output"][0]["content"][0]["text"]
            done = [d["item"] for n, d in events if n == "response.output_item.done"]
            assert {d["item_id"] for d in deltas} == {done[0]["id"]}
            completed = events[-1][1]["response"]
            assert events[-1][0] == "response.completed" and completed["output"] == done
            assert completed["id"] == events[0][1]["response"]["id"]
            same_record(await sample_of(st, "s"), await sample_of(st, "p"))
            _, _, raw = await post(http, url, responses_body("ls"), key="t")
            events = sse(raw)
            done = [d["item"] for n, d in events if n == "response.output_item.done"]
            assert [i["type"] for i in done] == ["reasoning", "function_call"]
            assert [d["output_index"] for n, d in events if n == "response.output_item.done"] == [0, 1]
            assert events[-1][1]["response"]["output"] == done
    asyncio.run(main())


def test_responses_cut_by_max_output_tokens_is_incomplete():
    async def main():
        async with stack(ResponsesAdapter, [LONG, LONG, "short", LONG * 20]) as st, aiohttp.ClientSession() as http:
            url = f"{st.url}/v1/responses"
            _, _, raw = await post(http, url, responses_body("hi", max_output_tokens=5))
            events = sse(raw)
            assert events[-1][0] == "response.incomplete"
            cut = events[-1][1]["response"]
            assert cut["status"] == "incomplete" and cut["incomplete_details"] == {"reason": "max_output_tokens"}
            assert cut["usage"]["output_tokens"] == 5
            _, reply, _ = await post(http, url, responses_body("hi", stream=False, max_output_tokens=5))
            assert reply["status"] == "incomplete" and reply["incomplete_details"] == {"reason": "max_output_tokens"}
            _, reply, _ = await post(http, url, responses_body("hi", stream=False, max_output_tokens=50))
            assert reply["status"] == "completed" and reply["incomplete_details"] is None
            # no max_output_tokens (as Codex sends it): cut only by the adapter's own cap, which ends normally
            _, _, raw = await post(http, url, responses_body("hi"))
            events = sse(raw)
            assert events[-1][0] == "response.completed"
            assert events[-1][1]["response"]["usage"]["output_tokens"] == st.adapter.settings.agent.max_new_tokens
    asyncio.run(main())


def test_responses_abort_mid_stream_is_response_failed():
    async def main():
        async with stack(ResponsesAdapter, [{"text": LONG, "abort_after": 3}, "ok"]) as st, \
                aiohttp.ClientSession() as http:
            status, _, raw = await post(http, f"{st.url}/v1/responses", responses_body("hi"))
            events = sse(raw)
            assert status == 200 and events[-1][0] == "response.failed"
            assert events[-1][1]["response"]["error"]["code"] == "server_is_overloaded"
            status, reply, _ = await post(http, f"{st.url}/v1/responses", responses_body("hi", stream=False))
            assert status == 200 and reply["output"][0]["content"][0]["text"] == "ok"
    asyncio.run(main())


def test_echoed_fields_are_checked_before_the_stream_opens():
    """A `model` that could not be encoded into an event is a 400, not a 200 and a cut stream."""
    async def main():
        for cls, body in ((AnthropicAdapter, anthropic_body(user("x"), stream=True)),
                          (ResponsesAdapter, responses_body("x"))):
            path = "/v1/messages" if cls is AnthropicAdapter else "/v1/responses"
            async with stack(cls, ["never"]) as st, aiohttp.ClientSession() as http:
                for model in ["\ud800", "x" * 5000, 7]:
                    raw = json.dumps({**body, "model": model}).encode()
                    status, err, _ = await post(http, f"{st.url}{path}", None, raw=raw)
                    assert status == 400 and "model" in json.dumps(err), (cls.name, status, err)
                assert st.engine.requests == []
    asyncio.run(main())


# --- the real embedded engine ------------------------------------------------------------------------------

def test_real_engine_streamed_and_plain_turns_record_the_same_tokens(tmp_path_factory):
    """Greedy turns through the embedded engine's own `stream: true`: same ids, log-probs and lengths as the
    same turn generated without streaming, and the deltas add up to the non-streamed reply text."""
    from aiohttp import web
    from transformers import AutoTokenizer

    from slimecli.agent.api.adapter import AdapterSettings
    from slimecli.agent.api.engine_link import EngineLink
    from slimecli.agent.api.render import Renderer
    from slimecli.agent.trajectory.manager import TrajectoryManager
    from slimecli.model.tool_calls import get_parser
    from tests.helpers.engine import engine_fixture

    fixture = engine_fixture(tmp_path_factory.mktemp("engine"))
    eng = next(fixture)

    async def main():
        renderer = Renderer(AutoTokenizer.from_pretrained(str(eng.model_path)), 4096)
        link = EngineLink(eng.url)
        for cls, path in ((AnthropicAdapter, "/v1/messages"), (ResponsesAdapter, "/v1/responses")):
            manager = TrajectoryManager(renderer.stop_ids, renderer.decode_all)
            adapter = cls(renderer, link, manager, get_parser("qwen"),
                          AdapterSettings(AgentConfig(max_new_tokens=48), RolloutConfig(temperature=0.0)))
            runner = web.AppRunner(adapter.app(), handler_cancellation=True)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            url = f"http://127.0.0.1:{runner.addresses[0][1]}{path}"
            try:
                async with aiohttp.ClientSession() as http:
                    if cls is AnthropicAdapter:
                        _, _, raw = await post(http, url, anthropic_body(user("Tell a story."), stream=True), key="s")
                        _, reply, _ = await post(http, url, anthropic_body(user("Tell a story.")), key="p")
                        streamed = anthropic_text(sse(raw))
                        plain = {i: b["text"] for i, b in enumerate(reply["content"]) if b["type"] == "text"}
                        streamed = {i: t for i, t in streamed.items() if i in plain}
                        plain = {i: t for i, t in plain.items() if t}
                    else:
                        _, _, raw = await post(http, url, responses_body("Tell a story."), key="s")
                        _, reply, _ = await post(http, url, responses_body("Tell a story.", stream=False), key="p")
                        streamed = "".join(d["delta"] for n, d in sse(raw) if n == "response.output_text.delta")
                        plain = "".join(c["text"] for i in reply["output"] if i["type"] == "message"
                                        for c in i["content"])
                    assert streamed == plain
                a, b = await sample_of_manager(manager, "s"), await sample_of_manager(manager, "p")
                assert (a.tokens, a.loss_mask, a.response_length, a.status) == \
                    (b.tokens, b.loss_mask, b.response_length, b.status)
                assert a.rollout_log_probs == pytest.approx(b.rollout_log_probs, abs=1e-4)
                assert a.response_length > 1
            finally:
                await runner.cleanup()
        await link.close()

    try:
        asyncio.run(main())
    finally:
        next(fixture, None)


async def sample_of_manager(manager: Any, sid: str) -> Sample:
    [s] = await manager.finish_session(sid, Sample(prompt="p"), 0.0)
    return s
