"""One episode: reset, then policy turn and environment step in turn until the environment is done, the turn
budget ends, or something goes wrong; the result is one training sample (tokens in, tokens out; the loss covers
the sampled tokens only) or a dropped episode with its reason.

What an environment does wrong never ends the run: an exception, a step past env.timeout_s, a reward that is not
a finite number, an observation that is not messages, a call to a tool it did not offer, a token budget overrun
each drop the episode with a counted reason. A tool call the parser cannot read is answered with an observation
that says why, and the episode goes on.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from slimecli.config.groups.env import EnvConfig
from slimecli.env.conversation import Conversation, TemplateError
from slimecli.env.protocol import Action, Environment, Observation, StepResult, ToolCall
from slimecli.model.tool_calls import ToolParser
from slimecli.model.tool_grammar import GrammarError, ToolChoice, tool_call_grammar
from slimecli.rollout.sample import Sample, Status, token_versions

# fn(input_ids, max_new_tokens, turn, extra sampling params) -> an engine's /generate reply (SGLang's native form)
Generate = Callable[[list[int], int, int, dict[str, Any]], Awaitable[dict[str, Any]]]
ILL_FORMED = ("Your tool call could not be parsed: write one JSON object with \"name\" and \"arguments\" inside "
              "<tool_call></tool_call> tags.")


class Dropped(Exception):
    """The episode cannot train: `reason` is the counted reason (env/<source>/dropped/<reason>)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


@dataclass
class EpisodeStats:
    turns: int = 0
    tool_calls: dict[str, int] = field(default_factory=dict)
    tool_errors: int = 0  # calls the parser could not read
    env_s: float = 0.0  # time in reset, step and close
    engine_s: float = 0.0  # time in the engine's /generate
    prompt_tokens: int = 0  # prompt tokens the engine was sent, over all turns
    cached_tokens: int = 0  # of which its prefix cache already held


def check_observation(obs: Any, where: str) -> Observation:
    if not isinstance(obs, Observation):
        raise Dropped("bad_observation", f"{where} returned {type(obs).__name__}, not an Observation")
    if not isinstance(obs.messages, list) or not all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content", ""), str | list)
            for m in obs.messages):
        raise Dropped("bad_observation", f"{where}: messages must be a list of {{role, content}} mappings")
    if obs.tools is not None and (not isinstance(obs.tools, list) or not all(
            isinstance(t, Mapping) and tool_name(t) for t in obs.tools)):
        raise Dropped("bad_observation", f"{where}: tools must be a list of function schemas with a name")
    return obs


def tool_name(schema: Mapping[str, Any]) -> str:
    fn = schema.get("function", schema)
    name = fn.get("name") if isinstance(fn, Mapping) else None
    return name if isinstance(name, str) else ""


def check_step(result: Any) -> StepResult:
    if not isinstance(result, StepResult):
        raise Dropped("bad_observation", f"step returned {type(result).__name__}, not a StepResult")
    reward = result.reward
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise Dropped("bad_reward", f"step reward is {type(reward).__name__}, not a number")
    if not math.isfinite(float(reward)):
        raise Dropped("bad_reward", f"step reward is {reward}")
    check_observation(result.observation, "step")
    return result


class EpisodeRunner:
    def __init__(self, cfg: EnvConfig, tokenizer: Any, parser: ToolParser, stop_ids: frozenset[int],
                 max_tokens_per_turn: int) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.parser = parser
        self.stop_ids = stop_ids
        self.max_tokens_per_turn = max_tokens_per_turn
        added = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
        self.added_tokens: dict[str, int] = {str(k): int(v) for k, v in added.items()}
        self._grammars: dict[str, str] = {}

    async def _timed(self, stats: EpisodeStats, what: str, call: Awaitable[Any]) -> Any:
        started = time.perf_counter()
        try:
            return await asyncio.wait_for(call, self.cfg.timeout_s)
        except TimeoutError:
            raise Dropped("timeout", f"{what} took longer than env.timeout_s={self.cfg.timeout_s:g}") from None
        except Dropped:
            raise
        except Exception as exc:  # the environment's own failure
            raise Dropped("env_error", f"{what}: {type(exc).__name__}: {exc}") from exc
        finally:
            stats.env_s += time.perf_counter() - started

    async def run(self, env: Environment, task: Mapping[str, Any], generate: Generate, sample: Sample) -> Sample:
        """The episode's sample (sample carries its identity: index, group, metadata); a dropped episode is a
        removed placeholder whose metadata says why."""
        stats = EpisodeStats()
        try:
            try:
                return await self._episode(env, task, generate, sample, stats)
            finally:
                try:
                    await self._timed(stats, "close", env.close())
                except Dropped as exc:  # a finished episode still trains; the failure is counted
                    sample.metadata["close_error"] = exc.detail
        except Dropped as exc:
            placeholder = Sample.aborted(exc.reason, prompt=sample.prompt, group_index=sample.group_index,
                                         index=sample.index, tokens=list(sample.tokens) or None,
                                         metadata={**sample.metadata, "drop_reason": exc.reason,
                                                   "drop_detail": exc.detail[:500]})
            self._stamp(placeholder, stats)
            return placeholder

    async def _episode(self, env: Environment, task: Mapping[str, Any], generate: Generate, sample: Sample,
                       stats: EpisodeStats) -> Sample:
        cfg = self.cfg
        obs = check_observation(await self._timed(stats, "reset", env.reset(task)), "reset")
        if not obs.messages:
            raise Dropped("bad_observation", "reset returned no messages")
        tools = obs.tools or []
        conv = Conversation(self.tokenizer, self.stop_ids)
        try:
            conv.open(list(obs.messages), tools)
        except Exception as exc:  # the template cannot render what the environment sent
            raise Dropped("bad_observation", f"reset messages: {type(exc).__name__}: {exc}") from exc
        sample.tokens = list(conv.tokens)
        total = 0.0
        versions: list[str] = []
        per_token: list[int] = []  # the version of each token after the prompt (observations: the last turn's)
        done = False
        while stats.turns < cfg.max_turns:
            budget = min(self.max_tokens_per_turn, cfg.max_tokens_per_episode - conv.added)
            if budget <= 0:
                raise Dropped("budget_exceeded", f"{conv.added} tokens after the prompt "
                                                 f"(env.max_tokens_per_episode={cfg.max_tokens_per_episode})")
            constraint = self._constraint(tools)
            started = time.perf_counter()
            reply = await generate(list(conv.tokens), budget, stats.turns, constraint)
            stats.engine_s += time.perf_counter() - started
            meta = reply.get("meta_info", {})
            stats.prompt_tokens += int(meta.get("prompt_tokens", len(conv.tokens)))
            stats.cached_tokens += int(meta.get("cached_tokens", 0))
            entries = meta.get("output_token_logprobs") or []
            ids = [int(e[1]) for e in entries]
            finish = (meta.get("finish_reason") or {}).get("type", "stop")
            if finish == "abort":
                raise Dropped("aborted", "the engine aborted the turn")
            log_probs = [float(e[0]) for e in entries]
            # under a grammar, a token it forced (masked log-prob exactly 0) was no choice of the policy
            conv.sampled(ids, log_probs, [0 if constraint and lp == 0.0 else 1 for lp in log_probs])
            versions.append(str(meta.get("weight_version", "")))
            per_token = _aligned(per_token + token_versions(meta, len(ids)), conv.added)
            stats.turns += 1
            action = self._action(ids, bool(tools))
            unknown = [c.name for c in action.tool_calls if c.name not in {tool_name(t) for t in tools}]
            if unknown:
                raise Dropped("unknown_tool", f"the policy called {unknown[0]!r}; offered: "
                                              f"{sorted(tool_name(t) for t in tools) or 'no tools'}")
            for call in action.tool_calls:
                stats.tool_calls[call.name] = stats.tool_calls.get(call.name, 0) + 1
            if action.ill_formed:
                stats.tool_errors += 1
                observation = Observation([{"role": "user", "content": ILL_FORMED}])
            else:
                result = check_step(await self._timed(stats, "step", env.step(action)))
                total += float(result.reward)
                if result.done:
                    done = True
                    break
                observation = result.observation
                if observation.tools is not None:
                    tools = observation.tools
            if stats.turns >= cfg.max_turns:
                break
            try:
                conv.observe(list(observation.messages), ids)
            except TemplateError as exc:
                raise Dropped("bad_observation", str(exc)) from exc
            per_token = _aligned(per_token, conv.added)
            if conv.added >= cfg.max_tokens_per_episode:
                raise Dropped("budget_exceeded", f"{conv.added} tokens after the prompt "
                                                 f"(env.max_tokens_per_episode={cfg.max_tokens_per_episode})")
        sample.tokens = list(conv.tokens)
        sample.response_length = conv.added
        sample.loss_mask = list(conv.mask)
        sample.rollout_log_probs = list(conv.log_probs)
        sample.response = self.tokenizer.decode(conv.tokens[conv.prompt_len:], skip_special_tokens=False)
        sample.reward = total
        sample.weight_versions = versions
        sample.token_versions = _aligned(per_token, conv.added)
        sample.status = Status.COMPLETED if done else Status.TRUNCATED
        sample.metadata["turn_limit"] = not done
        self._stamp(sample, stats)
        return sample

    def _constraint(self, tools: list[dict[str, Any]]) -> dict[str, str]:
        """The turn's structured-output params: the tool-call grammar where tools are offered (env.constrain), the
        answer regex where none are (env.regex)."""
        if not tools:
            return {"regex": self.cfg.regex} if self.cfg.regex else {}
        if self.cfg.constrain == "none":
            return {}
        fmt = getattr(self.parser, "call_format", None)
        if fmt is None:
            raise Dropped("bad_observation", f"env.constrain=tool_calls: the tool parser {self.cfg.tool_parser!r} "
                                             "declares no call format")
        key = json.dumps(tools, sort_keys=True, default=str)
        if key not in self._grammars:  # one grammar per tool list, not one per turn
            choice = ToolChoice(mode=self.cfg.tool_choice, parallel=self.cfg.parallel_tool_calls)
            try:
                self._grammars[key] = tool_call_grammar(tools, choice, fmt, self.added_tokens)
            except GrammarError as exc:
                raise Dropped("bad_observation", f"tools: {exc}") from exc
        return {"ebnf": self._grammars[key]}

    def _action(self, ids: list[int], parse_tools: bool) -> Action:
        body = ids[:-1] if ids and ids[-1] in self.stop_ids else ids
        text = self.tokenizer.decode(body, skip_special_tokens=False)
        parsed = self.parser.parse(text)
        if not parse_tools:  # an environment without tools reads the text itself
            return Action(text=text, content=text.strip() if not parsed.reasoning else parsed.text,
                          reasoning=parsed.reasoning)
        calls = tuple(ToolCall(f"call_{i}", c.name, dict(c.arguments)) for i, c in enumerate(parsed.tool_calls))
        return Action(text=text, content=parsed.text, reasoning=parsed.reasoning, tool_calls=calls,
                      ill_formed=parsed.ill_formed, parse_error="unparsable tool call" if parsed.ill_formed else "")

    @staticmethod
    def _stamp(sample: Sample, stats: EpisodeStats) -> None:
        sample.metadata.update(turns=stats.turns, tool_calls=dict(stats.tool_calls), tool_errors=stats.tool_errors,
                               env_s=stats.env_s, engine_s=stats.engine_s, prompt_tokens=stats.prompt_tokens,
                               cached_tokens=stats.cached_tokens)


def _aligned(versions: list[int], n: int) -> list[int]:
    """``versions`` cut or extended (by its last entry: the tokens of an observation, after their turn) to n."""
    return (versions + [versions[-1] if versions else -1] * n)[:n]
