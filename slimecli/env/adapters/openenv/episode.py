"""A loaded OpenEnv environment and its episodes: one WebSocket session (/ws) per episode.

The client speaks the /ws protocol with `websockets` (OpenEnv's own transport): importing openenv.core costs ~3 s
(gradio), and the HTTP /reset and /step endpoints are stateless (a fresh environment per request), so only /ws keeps
an episode's state. Where the server is at its max_concurrent_envs (CAPACITY_REACHED), an episode waits for a free
session.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from slimecli.env.adapters.openenv.server import Server
from slimecli.env.protocol import Action, Observation, StepResult, tool_result
from slimecli.env.provider import EnvProvider
from slimecli.net.retry import RetryPolicy, with_retries

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

KIND = "openenv"
CAPACITY_WAIT = 0.9  # of env.timeout_s: how long an episode waits for a free session
_log = logging.getLogger(__name__)


class OpenEnvProvider(EnvProvider):
    kind = KIND

    def __init__(self, env_id: str, args: Mapping[str, Any], *, app: str | None, base_url: str, server: Server | None,
                 mode: str, action_field: str | None, observation_field: str | None,
                 reset_kwargs: dict[str, Any], timeout_s: float) -> None:
        super().__init__(env_id, args)
        self.app, self.base_url, self.mode = app, base_url, mode
        self.pid = server.proc.pid if server is not None and server.proc is not None else None
        self.action_field, self.observation_field = action_field, observation_field
        self.reset_kwargs, self.timeout_s = reset_kwargs, timeout_s
        self.system_prompt: str | None = self.args.get("system_prompt")
        self._server = server
        self._warned_capacity = False

    def episode(self) -> OpenEnvEpisode:
        return OpenEnvEpisode(self)

    def describe(self) -> str:
        where = f"{self.app} started at {self.base_url}" if self.app else f"the server at {self.base_url}"
        return f"openenv:{self.env_id} ({where}, {self.mode} environment)"

    async def aclose(self) -> None:
        if self._server is not None:
            await asyncio.to_thread(self._server.stop)

    def capacity_reached(self, data: Mapping[str, Any]) -> None:
        if not self._warned_capacity:
            self._warned_capacity = True
            _log.warning("openenv:%s: the server holds %s sessions at once (its max_concurrent_envs); episodes wait "
                         "for a free one. Raise it (MAX_CONCURRENT_ENVS in env.args.env_vars, where the app reads it) "
                         "or env.args.workers", self.env_id, data.get("max_sessions", "?"))


class _AtCapacity(Exception):
    pass


class OpenEnvEpisode:
    """One OpenEnv session (one /ws connection) driven by the policy's turns."""

    def __init__(self, provider: OpenEnvProvider) -> None:
        self.p = provider
        self._ws: ClientConnection | None = None

    async def reset(self, task: Mapping[str, Any]) -> Observation:
        data = await self._open({**self.p.reset_kwargs, **task})
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.p.system_prompt}] \
            if self.p.system_prompt else []
        prompt, shown = task.get("prompt"), self._text(data.get("observation") or {})
        if isinstance(prompt, list):
            messages += [dict(m) for m in prompt]
            prompt = None
        first = "\n\n".join(part for part in (prompt if isinstance(prompt, str) else "", shown) if part)
        if first or not messages:
            messages.append({"role": "user", "content": first})
        tools = None
        if self.p.mode == "mcp":
            listed = (await self._exchange({"type": "step", "data": {"type": "list_tools"}})).get("observation") or {}
            if "tools" not in listed:
                raise RuntimeError(f"openenv:{self.p.env_id}: its Action takes MCP calls but list_tools answered "
                                   f"{json.dumps(listed, default=str)[:300]}, not tools")
            tools = [{"type": "function", "function": {
                "name": t["name"], "description": t.get("description") or "",
                "parameters": t.get("input_schema") or t.get("inputSchema") or {"type": "object", "properties": {}}}}
                for t in listed["tools"] or []]
        return Observation(messages=messages, tools=tools)

    async def step(self, action: Action) -> StepResult:
        if self.p.mode == "text":
            assert self.p.action_field is not None
            # the answer without reasoning and tool calls; the raw text where the rollout parsed nothing out of it
            text = action.content if action.content or action.reasoning or action.tool_calls else action.text
            data = await self._exchange({"type": "step", "data": {self.p.action_field: text}})
            shown = self._text(data.get("observation") or {})
            return StepResult(Observation([{"role": "user", "content": shown}] if shown else []),
                              reward=_reward(data), done=bool(data.get("done")))
        if action.ill_formed:
            return StepResult(Observation([{"role": "user", "content": action.parse_error or "Malformed tool call."}]))
        if not action.tool_calls:
            return StepResult(done=True, info={"ended": "no tool call"})
        messages, reward, done = [], 0.0, False
        for call in action.tool_calls:
            data = await self._exchange({"type": "step", "data": {
                "type": "call_tool", "tool_name": call.name, "arguments": call.arguments}})
            messages.append(tool_result(call, _tool_text(data.get("observation") or {})))
            reward += _reward(data)
            done = bool(data.get("done"))
            if done:
                break
        return StepResult(Observation(messages), reward=reward, done=done)

    async def close(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            try:
                await ws.send(json.dumps({"type": "close"}))
            except Exception as exc:  # noqa: BLE001 - already closed by the server: nothing to release
                _log.debug("openenv close message not sent: %s", exc)
            await ws.close()

    async def _open(self, reset_data: dict[str, Any]) -> dict[str, Any]:
        """Connect and reset; a server at capacity is retried until a session frees or CAPACITY_WAIT runs out."""
        from websockets.asyncio.client import connect

        url = self.p.base_url.replace("http", "ws", 1) + "/ws"
        loopback = any(h in url for h in ("://127.0.0.1", "://localhost", "://[::1]"))
        message = {"type": "reset", "data": json.loads(json.dumps(reset_data, default=str))}
        wait_s = CAPACITY_WAIT * self.p.timeout_s

        async def attempt() -> dict[str, Any]:
            try:
                self._ws = await connect(url, proxy=None if loopback else True, max_size=100 * 2**20,
                                         open_timeout=self.p.timeout_s)
                return await self._exchange(message)
            except _AtCapacity as e:
                await self.close()
                self.p.capacity_reached(e.args[0])
                raise
            except Exception:
                await self.close()  # the session is not the rollout's yet: release it here
                raise

        policy = RetryPolicy(max_retries=None, backoff_s=0.05, backoff_max_s=0.5, timeout_s=wait_s)
        try:
            return await with_retries(attempt, policy, retryable=lambda exc: isinstance(exc, _AtCapacity))
        except _AtCapacity as e:
            raise RuntimeError(f"openenv:{self.p.env_id}: the server stayed at its session limit "
                               f"({e.args[0].get('max_sessions', '?')}) for {wait_s:.0f} s; "
                               "raise its max_concurrent_envs or env.args.workers") from None

    async def _exchange(self, message: dict[str, Any]) -> dict[str, Any]:
        from websockets.exceptions import ConnectionClosed

        if self._ws is None:
            raise RuntimeError(f"openenv:{self.p.env_id}: the episode is not reset or already closed")
        try:
            await self._ws.send(json.dumps(message))
        except ConnectionClosed:
            pass  # the server may have said why before closing (CAPACITY_REACHED): read it below
        try:
            raw = await asyncio.wait_for(self._ws.recv(), self.p.timeout_s)
        except ConnectionClosed as e:
            raise RuntimeError(f"openenv:{self.p.env_id}: the server closed the session ({e})") from None
        reply = json.loads(raw)
        if reply.get("type") == "error":
            error = reply.get("data") or {}
            if error.get("code") == "CAPACITY_REACHED":
                raise _AtCapacity(error)
            raise RuntimeError(f"openenv:{self.p.env_id}: {error.get('code', 'error')}: {error.get('message')} "
                               + (json.dumps(error["errors"], default=str)[:500] if error.get("errors") else ""))
        data = reply.get("data")
        return data if isinstance(data, dict) else {}

    def _text(self, observation: Mapping[str, Any]) -> str:
        field = self.p.observation_field
        value: Any = observation.get(field) if field and field in observation else (observation or "")
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _reward(data: Mapping[str, Any]) -> float:
    reward = data.get("reward")
    return 0.0 if reward is None else float(reward)


def _tool_text(observation: Mapping[str, Any]) -> str:
    """A call_tool observation as the model reads it: the MCP content's text, else the result's data."""
    error = observation.get("error")
    if error:
        return f"Error ({error.get('error_type', 'error')}): {error.get('message', '')}"
    result = observation.get("result")
    if isinstance(result, dict):
        texts = [c.get("text", "") for c in result.get("content") or [] if isinstance(c, dict) and "text" in c]
        body: Any = "\n".join(texts) if texts else result.get("data", result)
        if result.get("is_error"):
            return f"Error: {body}"
        result = body
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
