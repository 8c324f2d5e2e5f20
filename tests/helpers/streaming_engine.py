"""THE TEST ENGINE (tests/helpers/scripted_engine.py) with SGLang's `stream: true` on /generate.

A streamed reply is one `data: {...}` chunk per scripted token (cumulative, as SGLang sends by default; or only
the new tokens with `incremental=True`, as SGLang's incremental streaming output), then `data: [DONE]`. Extra
script keys: {"abort_after": N} ends the stream after N tokens with finish type abort (a weight update's pause);
{"gate": true} stops after the first `gate_after` tokens until `release()` (so a test can see deltas arrive
before the turn ends, without timing). A stop string in `sampling_params.stop` ends the output at the token
that completes it, with finish `{"type": "stop", "matched": <the string>}`.

    python tests/helpers/streaming_engine.py --model DIR --port P --script script.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scripted_engine import ScriptedEngine


class StreamingEngine(ScriptedEngine):
    def __init__(self, tokenizer: Any, script: list[Any], incremental: bool = False, gate_after: int = 2) -> None:
        super().__init__(tokenizer, script)
        self.incremental = incremental
        self.gate_after = gate_after
        self.gate = asyncio.Event()
        self.streams = 0  # streamed requests answered

    def release(self) -> None:
        self.gate.set()

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        ids, params, rid = body.get("input_ids"), body.get("sampling_params") or {}, body.get("rid") or "x"
        stream = bool(body.get("stream"))
        self.requests.append({"rid": rid, "input_len": len(ids), "sampling_params": params,
                              "return_logprob": body.get("return_logprob"), "stream": stream})
        item = self.script.pop(0) if self.script else self.fallback
        item = item if isinstance(item, dict) else {"text": item}
        if item.get("hang"):  # answers only when aborted
            event = self._hanging[rid] = asyncio.Event()
            out: list[int] = []
            reason: dict[str, Any] = {"type": "abort", "message": "aborted"}
        else:
            out, reason = self._output(item, params)
        if not stream:
            if item.get("hang"):
                await event.wait()
            return web.json_response(self._reply(ids, out, reason))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        self.streams += 1
        if item.get("hang"):
            await event.wait()
            await self._send(resp, ids, [], 0, reason)
        cut = item.get("abort_after")
        for n in range(1, len(out) + 1):
            if item.get("gate") and n == self.gate_after + 1:
                await self.gate.wait()
            if cut is not None and n > cut:
                await self._send(resp, ids, out, cut, {"type": "abort", "message": "aborted"})
                break
            await self._send(resp, ids, out, n, reason if n == len(out) else None)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    def _output(self, item: dict[str, Any], params: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
        out = self.tok.encode(item["text"], add_special_tokens=False)
        finish = item.get("finish", "stop")
        stops = params.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        for n in range(1, len(out) + 1):
            text = self.tok.decode(out[:n])
            hit = next((s for s in stops if s in text), None)
            if hit is not None:
                return out[:n], {"type": "stop", "matched": hit}
        if finish == "stop":
            out.append(self.stop_id)
        limit = int(params.get("max_new_tokens", 128))
        if len(out) > limit:
            return out[:limit], {"type": "length", "length": limit}
        if finish == "stop":
            return out, {"type": "stop", "matched": self.stop_id}
        return out, {"type": "length", "length": len(out)}

    async def _send(self, resp: web.StreamResponse, ids: list[int], out: list[int], n: int,
                    reason: dict[str, Any] | None) -> None:
        chunk = self._reply(ids, out[:n], reason)
        chunk["meta_info"]["completion_tokens"] = n
        if self.incremental and n > 1:
            step = 1 if reason is None or reason["type"] != "abort" else 0
            entries = chunk["meta_info"]["output_token_logprobs"]
            chunk["meta_info"]["output_token_logprobs"] = entries[n - step:] if step else []
            chunk["output_ids"] = chunk["output_ids"][n - step:] if step else []
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--script", required=True)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    with open(args.script) as f:
        script = json.load(f)
    engine = StreamingEngine(AutoTokenizer.from_pretrained(args.model), script)
    web.run_app(engine.app(), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
