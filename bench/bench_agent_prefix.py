"""Time to first token of an agent turn: a warm prefix cache against a cold one, same engine, same run.

An agent CLI sends its long system prompt (and the turns so far) with every turn; the engine's prefix cache
should make every turn after the first pay only for its new tail. This starts the agent back-end as
training does (the Anthropic adapter over the embedded engine and the tiny model), builds a system prompt
of about --prefix-tokens tokens, and times Messages requests with max_tokens=1 (the whole reply is the
first token): cold ones whose system prompt starts with a fresh nonce (nothing cached matches), and warm
ones that repeat a prompt the engine has seen, with a new user message. Repetitions alternate cold and
warm so both see the same machine load. Prints the medians and the ratio (goal: warm <= 0.2 x cold).

    python bench/bench_agent_prefix.py [--prefix-tokens 10000 --reps 5]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import time
import uuid
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slimecli.agent.api.service import AgentService  # noqa: E402
from slimecli.config.compose import load  # noqa: E402

PARAGRAPH = ("You are a coding agent working in a sandboxed repository. Read the files you need, make the "
             "smallest change that fixes the problem, run the tests, and report what you changed. Rule {i}: "
             "prefer editing existing code to adding new modules; keep the public interface stable.\n")


def system_prompt(service: AgentService, tokens: int, nonce: str) -> str:
    """About `tokens` tokens of instructions, starting with `nonce` (a different nonce shares no prefix)."""
    text, i = f"Session {nonce}.\n", 0
    while len(service.renderer.tokenizer.encode(text)) < tokens:
        chunk = "".join(PARAGRAPH.format(i=i + k) for k in range(20))
        text += chunk
        i += 20
    return text


async def turn(http: aiohttp.ClientSession, url: str, system: str, user: str) -> float:
    body = {"model": "slimecli", "max_tokens": 1, "system": system, "messages": [{"role": "user", "content": user}]}
    headers = {"x-api-key": f"bench-{uuid.uuid4().hex}", "anthropic-version": "2023-06-01"}
    start = time.perf_counter()
    async with http.post(f"{url}/v1/messages", json=body, headers=headers) as resp:
        await resp.read()
        if resp.status != 200:
            raise SystemExit(f"the adapter answered {resp.status}: {(await resp.text())[:300]}")
    return time.perf_counter() - start


async def main_async(args: argparse.Namespace) -> int:
    cfg = load(["agent=claude_code", "agent.max_new_tokens=1", f"agent.max_context_len={args.prefix_tokens + 2048}"],
               uses_agent=True)
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, temperature=0.0))
    service = AgentService(cfg, port=0)
    await service.start()
    cold: list[float] = []
    warm: list[float] = []
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
            shared = system_prompt(service, args.prefix_tokens, "warm")
            await turn(http, service.base_url, shared, "warm-up")  # the engine caches this prompt's prefix
            await turn(http, service.base_url, system_prompt(service, args.prefix_tokens, "x"), "warm-up")
            for rep in range(args.reps):
                cold.append(await turn(http, service.base_url,
                                       system_prompt(service, args.prefix_tokens, uuid.uuid4().hex), f"task {rep}"))
                warm.append(await turn(http, service.base_url, shared, f"task {rep}"))
    finally:
        await service.stop()
    n = len(service.renderer.tokenizer.encode(system_prompt(service, args.prefix_tokens, "warm")))
    c, w = statistics.median(cold), statistics.median(warm)
    print(f"agent turn, ~{n}-token shared system prompt, tiny model, embedded engine ({args.reps} reps)")
    print(f"{'cold (no shared prefix)':<28}{c * 1000:>10.1f} ms")
    print(f"{'warm (prefix cached)':<28}{w * 1000:>10.1f} ms")
    ratio = w / c
    print(f"warm / cold = {ratio:.3f}  (goal <= 0.2: {'met' if ratio <= 0.2 else 'NOT met'})")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix-tokens", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=5)
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
