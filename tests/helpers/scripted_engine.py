"""THE TEST ENGINE of the agent protocol tests: a thin scripted engine speaking SGLang's /generate API.

It does not run a model. Each /generate call answers the next scripted output (tokenized with the real
tokenizer of the model directory, ending with <|im_end|>, with made-up log-probs), so the protocol tests can
make the CLIs see a well-formed tool call. Only the protocol tests use it; the plain-text tests use the real
embedded engine. Script items: "text", {"text": ..., "finish": "stop"|"length"}, or {"hang": true} (answers
only when aborted). Requests and aborts are listed at GET /script/log; POST /script/reset {"script": [...]}
starts over with a new script.

    python tests/helpers/scripted_engine.py --model DIR --port P --script script.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from aiohttp import web


class ScriptedEngine:
    def __init__(self, tokenizer: Any, script: list[Any], fallback: str = "Done.") -> None:
        self.tok = tokenizer
        self.script = list(script)
        self.fallback = fallback
        self.requests: list[dict[str, Any]] = []
        self.aborted: list[str] = []
        self._hanging: dict[str, asyncio.Event] = {}
        self.stop_id = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 << 20)
        app.add_routes([web.post("/generate", self.generate), web.post("/abort_request", self.abort),
                        web.get("/health", self.ok), web.get("/health_generate", self.ok),
                        web.get("/get_model_info", self.info), web.get("/script/log", self.log),
                        web.post("/script/reset", self.reset)])
        return app

    async def ok(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": "scripted", "is_generation": True, "weight_version": "scripted"})

    async def log(self, request: web.Request) -> web.Response:
        return web.json_response({"requests": self.requests, "aborted": self.aborted})

    async def reset(self, request: web.Request) -> web.Response:
        """A new script and an empty log, so one engine process serves test after test; a request still
        hanging from the last script is answered as aborted."""
        body = await request.json()
        for event in self._hanging.values():
            event.set()
        self._hanging.clear()
        self.script, self.requests, self.aborted = list(body["script"]), [], []
        return web.json_response({})

    async def abort(self, request: web.Request) -> web.Response:
        await self.abort_rid((await request.json()).get("rid"))
        return web.json_response({})

    async def abort_rid(self, rid: str) -> None:
        self.aborted.append(rid)
        if rid in self._hanging:
            self._hanging[rid].set()

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        ids, params, rid = body.get("input_ids"), body.get("sampling_params") or {}, body.get("rid") or "x"
        if not isinstance(ids, list) or not ids:
            return web.json_response({"error": {"message": "input_ids required"}}, status=400)
        self.requests.append({"rid": rid, "input_len": len(ids), "sampling_params": params,
                              "return_logprob": body.get("return_logprob")})
        item = self.script.pop(0) if self.script else self.fallback
        if isinstance(item, dict) and item.get("hang"):
            event = self._hanging[rid] = asyncio.Event()
            await event.wait()
            return web.json_response(self._reply(ids, [], {"type": "abort", "message": "aborted"}))
        text = item["text"] if isinstance(item, dict) else item
        finish = item.get("finish", "stop") if isinstance(item, dict) else "stop"
        out = self.tok.encode(text, add_special_tokens=False)
        limit = int(params.get("max_new_tokens", 128))
        if finish == "stop":
            out.append(self.stop_id)
        if len(out) > limit:
            out, finish = out[:limit], "length"
        reason = {"type": "stop", "matched": self.stop_id} if finish == "stop" else {"type": "length",
                                                                                      "length": len(out)}
        return web.json_response(self._reply(ids, out, reason))

    def _reply(self, ids: list[int], out: list[int], reason: dict[str, Any]) -> dict[str, Any]:
        logprobs = [[-0.1 * (1 + i % 7), t, None] for i, t in enumerate(out)]
        return {"text": self.tok.decode(out), "output_ids": out, "meta_info": {
            "id": "scripted", "finish_reason": reason, "prompt_tokens": len(ids), "completion_tokens": len(out),
            "cached_tokens": 0, "weight_version": "scripted", "output_token_logprobs": logprobs}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--script", required=True)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    with open(args.script) as f:
        script = json.load(f)
    engine = ScriptedEngine(AutoTokenizer.from_pretrained(args.model), script)
    web.run_app(engine.app(), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()


class Stack:
    """In-process test stack: this scripted engine + one adapter on loopback ports (for the adapter tests)."""

    def __init__(self, adapter_cls: type, tokenizer: Any, script: list[Any], context_len: int = 65536,
                 max_turns: int = 64, max_body_bytes: int = 32 << 20) -> None:
        from slimecli.agent.api.adapter import AdapterSettings
        from slimecli.agent.api.engine_link import EngineLink
        from slimecli.agent.api.render import Renderer
        from slimecli.agent.trajectory.manager import TrajectoryManager
        from slimecli.config.groups.agent import AgentConfig
        from slimecli.model.tool_calls import get_parser

        self.engine = ScriptedEngine(tokenizer, script)
        self.renderer = Renderer(tokenizer, context_len)
        self.manager = TrajectoryManager(self.renderer.stop_ids, self.renderer.decode_all, max_turns)
        self._link = EngineLink("http://127.0.0.1:1")
        self.adapter = adapter_cls(self.renderer, self._link, self.manager, get_parser("qwen"),
                                   AdapterSettings(AgentConfig(max_new_tokens=256), max_body_bytes=max_body_bytes))
        self._runners: list[web.AppRunner] = []

    async def _serve(self, app: web.Application, **kw: Any) -> str:
        runner = web.AppRunner(app, access_log=None, **kw)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self._runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    async def __aenter__(self) -> Stack:
        self._link.base_url = await self._serve(self.engine.app())
        self.url = await self._serve(self.adapter.app(), handler_cancellation=True)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._link.close()
        for runner in reversed(self._runners):
            await runner.cleanup()
