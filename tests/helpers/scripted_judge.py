"""A scripted judge on loopback: a real aiohttp server speaking SGLang's /generate and the OpenAI chat API.

It runs no model. Its verdict depends on the graded answer (the text after "Answer to grade:" in the judge's
prompt, up to the next blank line): an answer containing GOOD gets PASS, BAD gets FAIL, GARBLED gets a reply
without a verdict, SCORE<n> gets n, DOWN a 503 every time, FLAKY a 500 on its first request; anything else
gets FAIL. A JSON-schema constraint is answered with {"verdict": ...}. Every request body is kept
(`requests`) so tests can see the prompt and the constraint sent.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from aiohttp import web

ANSWER = re.compile(r"Answer to grade:\n(.*?)(\n\n|$)", re.S)


class ScriptedJudge:
    def __init__(self, tokenizer_path: str | None = None, api_key: str | None = None) -> None:
        self.tokenizer_path = tokenizer_path
        self.api_key = api_key
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.seen: Counter[str] = Counter()
        self.url = ""
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes([web.post("/generate", self.generate), web.post("/v1/chat/completions", self.chat),
                        web.get("/get_model_info", self.info), web.get("/health_generate", self.ok)])
        return app

    async def __aenter__(self) -> ScriptedJudge:
        self._runner = web.AppRunner(self.app())
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def ok(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": "scripted", "tokenizer_path": self.tokenizer_path,
                                  "is_generation": True})

    def _verdict(self, prompt: str, schema: bool) -> tuple[int, str]:
        found = ANSWER.search(prompt)
        answer = found.group(1) if found else ""
        self.seen[answer] += 1
        if "DOWN" in answer:
            return 503, "judge overloaded"
        if "FLAKY" in answer and self.seen[answer] == 1:
            return 500, "transient failure"
        if "GARBLED" in answer:
            return 200, "I cannot decide, sorry" if not schema else '{"thoughts": "unsure"}'
        score = re.search(r"SCORE(\d+)", answer)
        verdict = score.group(1) if score else ("PASS" if "GOOD" in answer else "FAIL")
        if schema:
            return 200, json.dumps({"verdict": int(verdict) if score else verdict})
        return 200, verdict

    def _authorized(self, request: web.Request) -> bool:
        return self.api_key is None or request.headers.get("Authorization") == f"Bearer {self.api_key}"

    async def generate(self, request: web.Request) -> web.Response:
        self.paths.append(request.path)
        if not self._authorized(request):
            return web.json_response({"error": {"message": "unauthorized"}}, status=401)
        body = await request.json()
        self.requests.append(body)
        if not isinstance(body.get("text"), str):
            return web.json_response({"error": {"message": "text: required"}}, status=400)
        status, text = self._verdict(body["text"], "json_schema" in body.get("sampling_params", {}))
        if status != 200:
            return web.json_response({"error": {"message": text}}, status=status)
        return web.json_response({"text": text, "output_ids": [], "meta_info": {"finish_reason": {"type": "stop"}}})

    async def chat(self, request: web.Request) -> web.Response:
        self.paths.append(request.path)
        if not self._authorized(request):
            return web.json_response({"error": {"message": "unauthorized"}}, status=401)
        body = await request.json()
        self.requests.append(body)
        prompt = body["messages"][-1]["content"]
        status, text = self._verdict(prompt, "response_format" in body)
        if status != 200:
            return web.json_response({"error": {"message": text}}, status=status)
        return web.json_response({"id": "x", "object": "chat.completion", "model": body.get("model"),
                                  "choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": text}}]})
