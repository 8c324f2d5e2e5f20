"""Played episodes, recorded and shown (`slimecli env run`): wrappers around an environment, its provider and the
engine client append what each did to the episode's events (reset, step, the policy's decoded turn), and the
events render as a transcript, a summary over the episodes and a JSONL row."""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from slimecli.env.render import message_line, names_of, shorten

if TYPE_CHECKING:
    from slimecli.env.protocol import Action, Environment, Observation, StepResult
    from slimecli.env.provider import EnvProvider

# what one episode did, in order (set per episode task; the engine and environment wrappers append to it)
_EVENTS: contextvars.ContextVar[list[dict[str, Any]]] = contextvars.ContextVar("slimecli_env_events")


def record_events() -> list[dict[str, Any]]:
    """A fresh list that this context's (an episode task's) wrapped engine and environment calls append to."""
    events: list[dict[str, Any]] = []
    _EVENTS.set(events)
    return events


def _event(event: dict[str, Any]) -> None:
    events = _EVENTS.get(None)
    if events is not None:
        events.append(event)


def _observation(obs: Any) -> dict[str, Any]:
    messages = getattr(obs, "messages", None)
    tools = getattr(obs, "tools", None)
    return {"messages": [dict(m) if isinstance(m, Mapping) else repr(m) for m in messages]
            if isinstance(messages, list) else repr(obs),
            "tools": names_of(tools) if isinstance(tools, list) else None}


class RecordingEnv:
    """An episode's environment as it is, each reset and step also recorded as an event."""

    def __init__(self, env: Environment) -> None:
        self.env = env

    async def reset(self, task: Mapping[str, Any]) -> Observation:
        obs = await self.env.reset(task)
        _event({"reset": _observation(obs)})
        return obs

    async def step(self, action: Action) -> StepResult:
        result = await self.env.step(action)
        reward, done, info = (getattr(result, k, None) for k in ("reward", "done", "info"))
        _event({"step": {"reward": reward if isinstance(reward, int | float) else repr(reward), "done": done,
                         "info": info, **_observation(getattr(result, "observation", None))},
                "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in action.tool_calls]})
        return result

    async def close(self) -> None:
        await self.env.close()


class RecordingProvider:
    """A loaded environment whose episodes are recorded (RecordingEnv); everything else is the provider's."""

    def __init__(self, provider: EnvProvider) -> None:
        self.provider = provider

    def episode(self) -> RecordingEnv:
        return RecordingEnv(self.provider.episode())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.provider, name)


class RecordingEngine:
    """An engine client whose /generate replies are recorded as the policy's turns (decoded)."""

    def __init__(self, client: Any, tokenizer: Any) -> None:
        self.client, self.tokenizer = client, tokenizer

    async def generate(self, **kwargs: Any) -> Any:
        out = await self.client.generate(**kwargs)
        reply = out if isinstance(out, dict) else out[0]
        meta = reply.get("meta_info") or {}
        ids = [int(e[1]) for e in meta.get("output_token_logprobs") or []]
        _event({"policy": self.tokenizer.decode(ids, skip_special_tokens=False), "tokens": len(ids),
                "finish": (meta.get("finish_reason") or {}).get("type", "")})
        return out


def _message_lines(messages: Any, indent: str, limit: int | None) -> list[str]:
    """An observation's recorded messages (a list, else the observation's repr), a line each."""
    return [f"{indent}{message_line(message, limit) if isinstance(message, Mapping) else message}"
            for message in (messages if isinstance(messages, list) else [messages])]


def transcript(number: int, total: int, rec: dict[str, Any], sample: Any, events: list[dict[str, Any]],
               limit: int | None) -> list[str]:
    """Episode `number` of `total`: the task, each observation, policy turn and step, then its result."""
    lines = [f"── episode {number}/{total} · {rec['source']} · task {shorten(rec['task'], limit)}"]
    turn = 0
    for event in events:
        if "reset" in event:
            obs = event["reset"]
            lines += _message_lines(obs["messages"], "  ", limit)
            if obs["tools"] is not None:
                lines.append(f"  tools: {', '.join(obs['tools'])}")
        elif "policy" in event:
            turn += 1
            finish = f", {event['finish']}" if event["finish"] and event["finish"] != "stop" else ""
            lines.append(f"  turn {turn} policy ({event['tokens']} tokens{finish}): {shorten(event['policy'], limit)}")
        elif "step" in event:
            step = event["step"]
            calls = ", ".join(f"{c['name']}({shorten(c['arguments'], limit)})" for c in event["tool_calls"])
            head = f"  turn {turn} env: reward {step['reward']}" + (" · done" if step["done"] else "") \
                + (f" · called {calls}" if calls else "") + (f" · info {shorten(step['info'], limit)}"
                                                             if step["info"] else "")
            lines.append(head)
            lines += _message_lines(step["messages"], "    ", limit)
            if step["tools"] is not None and not step["done"]:
                lines.append(f"    tools now: {', '.join(step['tools'])}")
    meta = sample.metadata
    if sample.remove_sample:
        lines.append(f"  result: dropped ({meta.get('drop_reason')}): {shorten(meta.get('drop_detail', ''), limit)}")
    else:
        limit_note = " (turn limit)" if meta.get("turn_limit") else ""
        lines.append(f"  result: reward {float(sample.reward):g} · {meta.get('turns', turn)} turn(s){limit_note} · "
                     f"{sample.response_length} tokens")
    return lines


def summary(samples: list[Any]) -> list[str]:
    """Over the episodes: the mean reward (of those kept), the mean turns, the turn limits hit, the drops by
    reason."""
    kept = [s for s in samples if not s.remove_sample]
    mean_reward = sum(float(s.reward) for s in kept) / len(kept) if kept else 0.0
    mean_turns = sum(int(s.metadata.get("turns", 0)) for s in samples) / len(samples) if samples else 0.0
    reasons: dict[str, int] = {}
    for s in samples:
        if s.remove_sample:
            reason = str(s.metadata.get("drop_reason", "unknown"))
            reasons[reason] = reasons.get(reason, 0) + 1
    hit_limit = sum(1 for s in kept if s.metadata.get("turn_limit"))
    lines = [f"summary: {len(samples)} episode(s) · mean reward {mean_reward:.3f} (over {len(kept)} kept) · "
             f"mean turns {mean_turns:.2f} · turn limit {hit_limit} · dropped {len(samples) - len(kept)}"]
    if reasons:
        lines.append("dropped: " + ", ".join(f"{reason} {count}" for reason, count in sorted(reasons.items())))
    return lines


def jsonl_row(number: int, rec: dict[str, Any], sample: Any, events: list[dict[str, Any]]) -> dict[str, Any]:
    """Episode `number` as a JSON object: its task, result, drop reason, events, response and metadata."""
    meta = sample.metadata
    return {"episode": number, "source": rec["source"], "position": rec.get("position"), "task": rec["task"],
            "status": str(sample.status), "reward": float(sample.reward), "turns": meta.get("turns"),
            "dropped": bool(sample.remove_sample), "drop_reason": meta.get("drop_reason"),
            "drop_detail": meta.get("drop_detail"), "events": events, "response": sample.response,
            "metadata": meta}
