"""Adapter fuzzing: malformed bodies, wrong types and huge inputs get 4xx JSON errors, never a 5xx."""

from __future__ import annotations

import asyncio
import copy
import json
import random
from typing import Any

import aiohttp
from test_agent_adapters import anthropic_body, post, responses_body, tokenizer

from slimecli.agent.api.anthropic import AnthropicAdapter
from slimecli.agent.api.responses import ResponsesAdapter
from tests.helpers.scripted_engine import Stack

WEIRD: list[Any] = [None, True, 0, -1, 2**70, 1.5, float("nan"), "", "x" * 50, [], [None], [[]], {}, {"type": None},
                    {"type": "text"}, {"type": "tool_use"}, {"type": "tool_result"}, {"type": "function_call"},
                    {"type": "message", "role": "user"}, {"role": "assistant", "content": [{"type": 3}]}]

MALFORMED = [b"", b"{", b"null", b"[]", b"\"text\"", b"123", b"{\"messages\": }", b"\xff\xfe\x00",
             b"[" * 100000 + b"]" * 100000, json.dumps({"a": "\ud800"}).encode()]


def mutations(base: dict[str, Any], rng: random.Random, n: int) -> list[dict[str, Any]]:
    """Replace, drop or nest-corrupt random paths of a valid body."""
    out = []
    for _ in range(n):
        body = copy.deepcopy(base)
        for _ in range(rng.randint(1, 3)):
            node: Any = body
            path = []
            while isinstance(node, dict | list) and node and rng.random() < 0.7:
                key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
                path.append((node, key))
                node = node[key]
            if not path:
                continue
            parent, key = path[-1]
            if isinstance(parent, dict) and rng.random() < 0.3:
                del parent[key]
            else:
                parent[key] = copy.deepcopy(rng.choice(WEIRD))
        out.append(body)
    return out


def fuzz(adapter_cls: type, url_path: str, base: dict[str, Any], extra_paths: list[str]) -> None:
    async def main():
        script = ["ok"] * 1000
        async with Stack(adapter_cls, tokenizer(), script, context_len=4096, max_turns=10**6,
                         max_body_bytes=1 << 20) as st, \
                aiohttp.ClientSession() as http:
            url = f"{st.url}{url_path}"
            seen = {}
            for raw in MALFORMED:
                status, err, text = await post(http, url, None, raw=raw)
                assert status == 400 and err is not None and "error" in json.dumps(err), (raw[:40], status, text)
            for body in mutations(base, random.Random(1234), 300):
                data = json.dumps(body, allow_nan=True)
                status, err, text = await post(http, url, None, raw=data.encode())
                assert status < 500, (data[:500], status, text[:500])
                if status >= 400:
                    assert err is not None and "error" in err, text[:300]
                seen[status] = seen.get(status, 0) + 1
            assert seen.get(400, 0) > 20 and seen.get(200, 0) > 5  # the fuzzer hits both sides
            status, err, _ = await post(http, url, None, raw=b"{\"a\": \"" + b"x" * (2 << 20) + b"\"}")
            assert status == 413 and "error" in err  # over the body limit
            huge = copy.deepcopy(base)
            huge["instructions" if "input" in base else "system"] = "many words " * 50000  # valid, over context
            status, reply, text = await post(http, url, huge)
            assert status == 200, text[:300]
            for path in extra_paths:
                status, err, _ = await post(http, f"{st.url}{path}", None, raw=b"{bad")
                assert 400 <= status < 500 and err is not None, path
            async with http.get(url) as r:
                assert r.status == 405 and "error" in await r.json()

    asyncio.run(main())


def test_fuzz_anthropic_messages():
    base = anthropic_body([{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                           {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Write",
                                                              "input": {"a": 1}}]},
                           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                         "content": "done"}]}], stop_sequences=["END"])
    fuzz(AnthropicAdapter, "/v1/messages?beta=true", base, ["/v1/messages/count_tokens"])


def test_fuzz_openai_responses():
    base = responses_body([{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                           {"type": "function_call", "name": "exec_command", "arguments": "{}", "call_id": "c"},
                           {"type": "function_call_output", "call_id": "c", "output": "ok"}], stream=False)
    fuzz(ResponsesAdapter, "/v1/responses", base, [])
