"""The environment rollout's costs, side by side in one run against one embedded engine (the tiny model):

1. environment time against engine time per step, on the built-in tool environment (recipe env_lookup's settings:
   one step of batch_size x n_samples_per_prompt episodes): the environment must cost at most 10% of the engine;
2. 8-turn episodes, tokens in and tokens out (slimecli's episode loop) against re-tokenizing the rendered history
   each turn (what a loop over chat messages does): the prompt tokens the engine computes per turn (prompt less
   prefix-cache hit), and the hit rate, which must be at least 90% for tokens in, tokens out.

    python bench/bench_env.py [--episodes 8] [--turns 8]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


SYSTEM = " ".join(f"Rule {i}: keep your replies short, kind and on topic." for i in range(40))  # ~450 tokens


class Chatter:
    """Answers every turn with the same short observation and never ends: an episode is exactly env.max_turns. Its
    system prompt is as long as a real one (the engine caches prefixes of 256 tokens and more)."""

    async def reset(self, task: Any) -> Any:
        from slimecli.env.protocol import Observation

        return Observation([{"role": "system", "content": SYSTEM},
                            {"role": "user", "content": f"Tell me something about {task['topic']}."}])

    async def step(self, action: Any) -> Any:
        from slimecli.env.protocol import Observation, StepResult

        return StepResult(Observation([{"role": "user", "content": "Go on, tell me more."}]))

    async def close(self) -> None:
        pass


def config(overrides: list[str]) -> Any:
    from slimecli.config.compose import load

    return load(overrides)


async def env_vs_engine(url: str, tokenizer: Any) -> tuple[float, float]:
    from slimecli.env.rollout import EnvRollout
    from slimecli.rollout.client import EngineClient
    from slimecli.rollout.data import PromptSource

    cfg = config(["+recipe=env_lookup"])
    async with EngineClient(url) as engine:
        rollout = EnvRollout(cfg, tokenizer, [engine], PromptSource(cfg.task, cfg.run.seed))
        await rollout.collect()  # warm-up: grammars compiled, caches filled
        result = await rollout.collect()
        await rollout.stop()
    return result.metrics["env/env_s"], result.metrics["env/engine_s"]


async def tokens_in_tokens_out(url: str, tokenizer: Any, episodes: int, turns: int) -> list[tuple[int, int, int]]:
    """(turn, prompt tokens, computed tokens) of every turn of every episode, through the episode loop."""
    from slimecli.config.groups.env import EnvConfig
    from slimecli.env.episode import EpisodeRunner
    from slimecli.env.rollout import stop_ids
    from slimecli.model.tool_calls import HermesToolParser
    from slimecli.rollout.client import EngineClient
    from slimecli.rollout.sample import Sample

    rows: list[tuple[int, int, int]] = []
    runner = EpisodeRunner(EnvConfig(name="native", id="chatter", max_turns=turns, max_tokens_per_episode=100_000),
                           tokenizer, HermesToolParser(), stop_ids(tokenizer), 16)
    async with EngineClient(url) as engine:
        async def one(i: int) -> None:
            async def generate(ids: list[int], n: int, turn: int, extra: dict[str, Any]) -> dict[str, Any]:
                out = await engine.generate(input_ids=ids, sampling_params={"max_new_tokens": n, "temperature": 1.0,
                                                                           "sampling_seed": 1000 * i + turn},
                                            return_logprob=True)
                assert isinstance(out, dict)
                meta = out["meta_info"]
                rows.append((turn, meta["prompt_tokens"], meta["prompt_tokens"] - meta.get("cached_tokens", 0)))
                return out
            await runner.run(Chatter(), {"topic": f"topic {i}"}, generate, Sample())
        await asyncio.gather(*(one(i) for i in range(episodes)))
    return rows


async def retokenized(url: str, tokenizer: Any, episodes: int, turns: int) -> list[tuple[int, int, int]]:
    """The same episodes with the history re-rendered from messages each turn."""
    from slimecli.rollout.client import EngineClient

    rows: list[tuple[int, int, int]] = []
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    async with EngineClient(url) as engine:
        async def one(i: int) -> None:
            env = Chatter()
            messages = list((await env.reset({"topic": f"topic {i}"})).messages)
            for turn in range(turns):
                ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
                ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
                out = await engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 16, "temperature": 1.0,
                                                                           "sampling_seed": 1000 * i + turn})
                assert isinstance(out, dict)
                meta = out["meta_info"]
                rows.append((turn, meta["prompt_tokens"], meta["prompt_tokens"] - meta.get("cached_tokens", 0)))
                sampled = [t for t in out.get("output_ids", []) if t != im_end]
                messages.append({"role": "assistant", "content": tokenizer.decode(sampled)})
                messages += (await env.step(None)).observation.messages
        await asyncio.gather(*(one(i) for i in range(episodes)))
    return rows


def summary(rows: list[tuple[int, int, int]]) -> tuple[float, float]:
    later = [r for r in rows if r[0] > 0]  # the first turn's prompt is new either way
    hit = 1 - sum(c for _, _, c in later) / max(sum(p for _, p, _ in later), 1)
    return hit, statistics.mean(c for _, _, c in later)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--turns", type=int, default=8)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from slimecli.model.tiny import create_tiny_model
    from tests.helpers import free_port
    from tests.helpers.engine import start_engine, stop_engine

    with tempfile.TemporaryDirectory() as tmp:
        model = create_tiny_model(Path(tmp) / "model", seed=0)
        tokenizer = AutoTokenizer.from_pretrained(str(model))
        port = free_port()
        eng = start_engine([sys.executable, "-m", "slimecli", "rollout", "serve", f"model.path={model}",
                            f"rollout.port={port}", f"run.root={tmp}/runs"], port, model, Path(tmp) / "engine.log")
        try:
            env_s, engine_s = asyncio.run(env_vs_engine(eng.url, tokenizer))
            tito = asyncio.run(tokens_in_tokens_out(eng.url, tokenizer, args.episodes, args.turns))
            retok = asyncio.run(retokenized(eng.url, tokenizer, args.episodes, args.turns))
        finally:
            stop_engine(eng)
    ratio = env_s / engine_s
    print(f"1. one step of env_lookup: environment {env_s:.3f} s, engine {engine_s:.3f} s (summed over episodes): "
          f"environment/engine {ratio:.3f} (goal <= 0.10) {'PASS' if ratio <= 0.10 else 'FAIL'}")
    hit_t, computed_t = summary(tito)
    hit_r, computed_r = summary(retok)
    print(f"2. {args.episodes} episodes x {args.turns} turns, prompt tokens computed per turn after the first:")
    for turn in range(1, args.turns):
        t = [r for r in tito if r[0] == turn]
        r = [x for x in retok if x[0] == turn]
        print(f"   turn {turn}: tokens in, tokens out: prompt {statistics.mean(p for _, p, _ in t):6.0f}, computed "
              f"{statistics.mean(c for _, _, c in t):5.1f} | re-tokenized: prompt {statistics.mean(p for _, p, _ in r):6.0f}, "
              f"computed {statistics.mean(c for _, _, c in r):5.1f}")
    print(f"   prefix-cache hit rate: tokens in, tokens out {hit_t:.3f} (goal >= 0.90) "
          f"{'PASS' if hit_t >= 0.90 else 'FAIL'}; re-tokenized {hit_r:.3f}; computed per turn "
          f"{computed_t:.1f} vs {computed_r:.1f} ({computed_r / max(computed_t, 1e-9):.2f}x)")
    return 0 if ratio <= 0.10 and hit_t >= 0.90 else 1


if __name__ == "__main__":
    sys.exit(main())
