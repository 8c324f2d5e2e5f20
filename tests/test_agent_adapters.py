"""The Anthropic Messages and OpenAI Responses adapters over a real HTTP loopback, with the scripted test
engine (tests/helpers/scripted_engine.py) standing in for the model so the protocol details are deterministic."""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any

import aiohttp
import pytest

from slimecli.agent.api.anthropic import AnthropicAdapter
from slimecli.agent.api.responses import ResponsesAdapter
from slimecli.rollout.sample import Sample
from tests.helpers.scripted_engine import Stack

WRITE_TOOL = {"name": "Write", "description": "Write a file.",
              "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}}}
FN_TOOL = {"type": "function", "name": "exec_command", "description": "Run a command.", "strict": False,
           "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}


@functools.cache
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    from slimecli.config.groups.model import ModelConfig
    from slimecli.model.loading import resolve_model_path

    return AutoTokenizer.from_pretrained(str(resolve_model_path(ModelConfig())))


def call(name: str, args: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def run(coro):
    return asyncio.run(coro)


async def post(http: aiohttp.ClientSession, url: str, body: Any, key: str | None = "sess", raw: bytes | None = None,
               **kw: Any) -> tuple[int, Any, str]:
    headers = {"x-api-key": key} if key else {}
    data = raw if raw is not None else json.dumps(body)
    async with http.post(url, data=data, headers={**headers, "content-type": "application/json"}, **kw) as r:
        text = await r.text()
        try:
            return r.status, json.loads(text), text
        except ValueError:
            return r.status, None, text


def sse(text: str) -> list[tuple[str | None, dict]]:
    events = []
    for chunk in text.strip().split("\n\n"):
        name, data = None, None
        for line in chunk.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
        events.append((name, data))
    return events


def anthropic_body(messages: list, stream: bool = False, **kw: Any) -> dict:
    return {"model": "claude-x", "max_tokens": 512, "stream": stream, "messages": messages,
            "system": [{"type": "text", "text": "You are a test."}], "tools": [WRITE_TOOL],
            "metadata": {"user_id": "u"}, "thinking": {"type": "adaptive"}, **kw}


def consistent(s: Sample) -> None:
    assert len(s.tokens) == s.prompt_length + s.response_length
    assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length


def test_anthropic_streaming_sequence_count_tokens_and_recorded_turn():
    async def main():
        async with Stack(AnthropicAdapter, tokenizer(), ["Hello there."]) as st, aiohttp.ClientSession() as http:
            body = anthropic_body([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], stream=True)
            status, _, text = await post(http, f"{st.url}/v1/messages?beta=true", body)
            assert status == 200
            events = sse(text)
            assert [e[0] for e in events] == ["message_start", "ping", "content_block_start", "content_block_delta",
                                              "content_block_stop", "message_delta", "message_stop"]
            assert all(data["type"] == name for name, data in events)
            assert events[0][1]["message"]["content"] == [] and events[0][1]["message"]["role"] == "assistant"
            assert events[2][1]["content_block"] == {"type": "text", "text": ""}
            assert events[3][1]["delta"] == {"type": "text_delta", "text": "Hello there."}
            assert events[5][1]["delta"]["stop_reason"] == "end_turn"
            count_body = {k: v for k, v in body.items() if k not in ("max_tokens", "stream")}
            status, counted, _ = await post(http, f"{st.url}/v1/messages/count_tokens?beta=true", count_body)
            assert status == 200 and counted["input_tokens"] == events[0][1]["message"]["usage"]["input_tokens"]
            [req] = st.engine.requests
            assert req["return_logprob"] is True and req["input_len"] == counted["input_tokens"]
            [sample] = await st.manager.finish_session("sess", Sample(prompt="hi"), 0.0)
            consistent(sample)
            assert sample.response == "Hello there.<|im_end|>" and sample.loss_mask == [1] * sample.response_length
    run(main())


def test_anthropic_tool_use_round_trip_non_streaming():
    async def main():
        script = [call("Write", {"file_path": "/w/a.txt", "content": "x"}), "Done."]
        async with Stack(AnthropicAdapter, tokenizer(), script) as st, aiohttp.ClientSession() as http:
            msgs: list = [{"role": "user", "content": "write a.txt"}]
            status, reply, _ = await post(http, f"{st.url}/v1/messages", anthropic_body(msgs))
            assert status == 200 and reply["stop_reason"] == "tool_use" and reply["type"] == "message"
            [use] = reply["content"]
            assert use["type"] == "tool_use" and use["name"] == "Write" and use["id"].startswith("toolu_")
            assert use["input"] == {"file_path": "/w/a.txt", "content": "x"}
            msgs += [{"role": "assistant", "content": reply["content"]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                   "content": [{"type": "text", "text": "written"}]}]}]
            status, reply, _ = await post(http, f"{st.url}/v1/messages", anthropic_body(msgs))
            assert status == 200 and reply["stop_reason"] == "end_turn"
            assert reply["content"] == [{"type": "text", "text": "Done."}]
            assert reply["usage"]["output_tokens"] > 0
            [sample] = await st.manager.finish_session("sess", Sample(prompt="p"), 1.0)
            consistent(sample)
            assert sample.metadata["turns"] == 2 and sample.metadata["realigned"] == 0
            response = sample.tokens[sample.prompt_length:]
            sampled = [t for t, m in zip(response, sample.loss_mask, strict=True) if m]
            out = [tokenizer().encode(t, add_special_tokens=False) + [st.engine.stop_id] for t in script]
            assert sampled == out[0] + out[1]  # loss_mask is 1 exactly on the sampled tokens
            assert "<tool_response>\nwritten\n</tool_response>" in sample.response
    run(main())


def test_anthropic_stream_tool_use_events_and_stop_reasons():
    async def main():
        script = [call("Write", {"file_path": "a"}), {"text": "one two three four five six", "finish": "stop"},
                  "<tool_call>\n{broken\n</tool_call>"]
        async with Stack(AnthropicAdapter, tokenizer(), script) as st, aiohttp.ClientSession() as http:
            msgs = [{"role": "user", "content": "go"}]
            _, _, text = await post(http, f"{st.url}/v1/messages", anthropic_body(msgs, stream=True))
            events = sse(text)
            start = events[2][1]["content_block"]
            assert start["type"] == "tool_use" and start["input"] == {}
            assert json.loads(events[3][1]["delta"]["partial_json"]) == {"file_path": "a"}
            assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
            _, reply, _ = await post(http, f"{st.url}/v1/messages", anthropic_body(msgs, max_tokens=2))
            assert reply["stop_reason"] == "max_tokens" and st.engine.requests[-1]["sampling_params"][
                "max_new_tokens"] == 2
            _, reply, _ = await post(http, f"{st.url}/v1/messages", anthropic_body(msgs))
            assert reply["stop_reason"] == "end_turn"  # unparseable call: returned as text, turn marked ill-formed
            assert reply["content"] == [{"type": "text", "text": "<tool_call>\n{broken\n</tool_call>"}]
            samples = await st.manager.finish_session("sess", Sample(), 0.0)
            assert sum(s.metadata["ill_formed_turns"] for s in samples) == 1
    run(main())


def test_context_limit_gives_an_empty_length_turn_without_calling_the_engine():
    async def main():
        async with Stack(AnthropicAdapter, tokenizer(), ["never"], context_len=64) as st, \
                aiohttp.ClientSession() as http:
            status, reply, _ = await post(http, f"{st.url}/v1/messages",
                                          anthropic_body([{"role": "user", "content": "word " * 200}]))
            assert status == 200 and reply["stop_reason"] == "max_tokens"
            assert reply["content"] == [{"type": "text", "text": ""}] and reply["usage"]["output_tokens"] == 0
            assert st.engine.requests == []
    run(main())


def test_max_new_tokens_is_clamped_to_the_remaining_context():
    async def main():
        async with Stack(AnthropicAdapter, tokenizer(), ["ok"], context_len=400) as st, \
                aiohttp.ClientSession() as http:
            body = anthropic_body([{"role": "user", "content": "hi"}], max_tokens=100000, tools=[])
            status, reply, _ = await post(http, f"{st.url}/v1/messages", body)
            assert status == 200
            [req] = st.engine.requests
            assert req["sampling_params"]["max_new_tokens"] == min(256, 400 - req["input_len"])
    run(main())


def test_anthropic_errors_sessions_and_turn_limit():
    async def main():
        async with Stack(AnthropicAdapter, tokenizer(), [], max_turns=1) as st, aiohttp.ClientSession() as http:
            url = f"{st.url}/v1/messages"
            body = anthropic_body([{"role": "user", "content": "hi"}])
            status, err, _ = await post(http, url, body, key=None)
            assert status == 401 and err == {"type": "error", "error": {"type": "authentication_error",
                                                                       "message": err["error"]["message"]}}
            async with http.post(url, json=body, headers={"authorization": "Bearer bearer-sid"}) as r:
                assert r.status == 200
            status, err, _ = await post(http, url, body, key="bearer-sid")
            assert status == 429 and err["error"]["type"] == "rate_limit_error"
            st.manager.drop_session("closed")
            status, err, _ = await post(http, url, body, key="closed")
            assert status == 503 and err["error"]["type"] == "overloaded_error"
            status, err, _ = await post(http, f"{st.url}/v1/nothing", body)
            assert status == 404 and err["type"] == "error" and err["error"]["type"] == "not_found_error"
            status, err, _ = await post(http, url, {k: v for k, v in body.items() if k != "max_tokens"})
            assert status == 400 and err["error"]["type"] == "invalid_request_error"
            async with http.get(f"{st.url}/healthz") as r:
                assert r.status == 200 and (await r.json())["ok"] is True
    run(main())


def test_engine_abort_is_a_retryable_503_and_not_recorded():
    async def main():
        async with Stack(AnthropicAdapter, tokenizer(), [{"hang": True}, "after retry"]) as st, \
                aiohttp.ClientSession() as http:
            task = asyncio.create_task(post(http, f"{st.url}/v1/messages",
                                             anthropic_body([{"role": "user", "content": "hi"}])))
            while not st.engine.requests:
                await asyncio.sleep(0.05)
            await st.engine.abort_rid(st.engine.requests[0]["rid"])  # as a weight update with pause mode abort
            status, err, _ = await task
            assert status == 503 and err["error"]["type"] == "overloaded_error"
            status, reply, _ = await post(http, f"{st.url}/v1/messages",
                                          anthropic_body([{"role": "user", "content": "hi"}]))
            assert status == 200 and reply["content"][0]["text"] == "after retry"
            [sample] = await st.manager.finish_session("sess", Sample(), 0.0)
            assert sample.metadata["turns"] == 1
    run(main())


def test_client_disconnect_aborts_the_engine_request_and_records_nothing():
    async def main():
        async with Stack(AnthropicAdapter, tokenizer(), [{"hang": True}]) as st, aiohttp.ClientSession() as http:
            with pytest.raises(asyncio.TimeoutError):
                await post(http, f"{st.url}/v1/messages", anthropic_body([{"role": "user", "content": "hi"}]),
                           timeout=aiohttp.ClientTimeout(total=1.5))
            for _ in range(200):
                if st.engine.aborted:
                    break
                await asyncio.sleep(0.05)
            assert st.engine.aborted == [st.engine.requests[0]["rid"]]
            for _ in range(100):
                if not st.manager._sessions["sess"].in_flight:
                    break
                await asyncio.sleep(0.05)
            assert await st.manager.finish_session("sess", Sample(), 0.0) == []
    run(main())


def responses_body(items: list, stream: bool = True, **kw: Any) -> dict:
    return {"model": "m", "instructions": "Be brief.", "input": items, "stream": stream, "store": False,
            "tools": [FN_TOOL, {"type": "web_search", "external_web_access": False},
                      {"type": "custom", "name": "apply_patch", "format": {}},
                      {"type": "namespace", "name": "ns", "tools": []}],
            "tool_choice": "auto", "parallel_tool_calls": True, "reasoning": {"summary": "auto"},
            "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k", **kw}


def test_responses_streaming_function_call_and_output_round_trip():
    async def main():
        script = ["<think>\nshort plan\n</think>\n\n" + call("exec_command", {"cmd": "ls"}), "All good."]
        async with Stack(ResponsesAdapter, tokenizer(), script) as st, aiohttp.ClientSession() as http:
            items: list = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "d"}]},
                           {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list"}]}]
            async with http.post(f"{st.url}/v1/responses", json=responses_body(items),
                                 headers={"authorization": "Bearer codex-sid"}) as r:
                assert r.status == 200 and r.headers["content-type"].startswith("text/event-stream")
                events = sse(await r.text())
            names = [n for n, _ in events]
            assert names[0] == "response.created" and names[-1] == "response.completed"
            assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
            done = [d["item"] for n, d in events if n == "response.output_item.done"]
            assert [i["type"] for i in done] == ["reasoning", "function_call"]
            fc = done[1]
            assert fc["name"] == "exec_command" and json.loads(fc["arguments"]) == {"cmd": "ls"}
            completed = events[-1][1]["response"]
            assert completed["status"] == "completed" and completed["output"] == done
            assert completed["usage"]["total_tokens"] == completed["usage"]["input_tokens"] + completed["usage"][
                "output_tokens"]
            items += [*done, {"type": "function_call_output", "call_id": fc["call_id"], "output": "a.txt"}]
            async with http.post(f"{st.url}/v1/responses", json=responses_body(items, stream=False),
                                 headers={"authorization": "Bearer codex-sid"}) as r:
                reply = await r.json()
            assert reply["output"][0]["type"] == "message"
            assert reply["output"][0]["content"][0] == {"type": "output_text", "text": "All good.", "annotations": []}
            [sample] = await st.manager.finish_session("codex-sid", Sample(), 0.0)
            consistent(sample)
            assert sample.metadata["turns"] == 2 and sample.metadata["realigned"] == 0
            first_prompt = tokenizer().decode(sample.tokens[:sample.prompt_length])
            assert "exec_command" in first_prompt and "web_search" not in first_prompt and "apply_patch" not in \
                first_prompt
    run(main())


def test_responses_message_events_and_errors():
    async def main():
        async with Stack(ResponsesAdapter, tokenizer(), ["Hi!"]) as st, aiohttp.ClientSession() as http:
            async with http.post(f"{st.url}/v1/responses", json=responses_body("hello"),
                                 headers={"authorization": "Bearer s"}) as r:
                events = sse(await r.text())
            assert [n for n, _ in events] == [
                "response.created", "response.in_progress", "response.output_item.added",
                "response.content_part.added", "response.output_text.delta", "response.output_text.done",
                "response.content_part.done", "response.output_item.done", "response.completed"]
            assert events[4][1]["delta"] == "Hi!" and events[4][1]["item_id"] == events[7][1]["item"]["id"]
            status, err, _ = await post(http, f"{st.url}/v1/responses", {"input": 5}, key=None)
            assert status == 401 and set(err["error"]) == {"type", "code", "message", "param"}
            status, err, _ = await post(http, f"{st.url}/v1/responses", {"input": [{"type": "message"}]})
            assert status == 400 and err["error"]["type"] == "invalid_request_error"
    run(main())


def test_reserialised_tool_arguments_are_realigned_onto_the_sampled_tokens():
    """The model wrote compact JSON; the client sends the call back re-serialised: same sample, realigned."""
    async def main():
        compact = '<tool_call>\n{"name":"Write","arguments":{"file_path":"/w/a.txt","content":"x"}}\n</tool_call>'
        async with Stack(AnthropicAdapter, tokenizer(), [compact, "Done."]) as st, aiohttp.ClientSession() as http:
            msgs: list = [{"role": "user", "content": "write a.txt"}]
            _, reply, _ = await post(http, f"{st.url}/v1/messages", anthropic_body(msgs))
            msgs += [{"role": "assistant", "content": reply["content"]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": reply["content"][0]["id"],
                                                   "content": "ok"}]}]
            await post(http, f"{st.url}/v1/messages", anthropic_body(msgs))
            [sample] = await st.manager.finish_session("sess", Sample(), 0.0)
            consistent(sample)
            assert sample.metadata["realigned"] == 1 and sample.metadata["turns"] == 2
            response = sample.tokens[sample.prompt_length:]
            sampled = [t for t, m in zip(response, sample.loss_mask, strict=True) if m]
            stop = st.engine.stop_id
            assert sampled == tokenizer().encode(compact) + [stop] + tokenizer().encode("Done.") + [stop]
            assert "<tool_response>\nok\n</tool_response>" in sample.response
    run(main())
