"""A loaded verifiers taskset and its episodes: each one rollout of the library's `null` harness (the plain chat loop)
that slimecli's policy plays turn by turn. The library's own RolloutSession polices each turn (its @vf.stop,
@vf.intercept, max_turns), the turns go into a real vf.Trace, and the last step's reward is `Task.score` over it.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import time
import uuid
from collections.abc import Mapping
from typing import Any

from slimecli.config.groups.env import EnvConfig
from slimecli.env.adapters.verifiers.checks import KIND, check_data, check_taskset, text, v1
from slimecli.env.adapters.verifiers.tools import Tools
from slimecli.env.protocol import Action, Observation, StepResult
from slimecli.env.provider import EnvLoadError, EnvProvider

EVAL_SPLITS = ("test", "validation", "eval", "val", "dev")  # tried in turn for a held-out split the taskset names


class VerifiersProvider(EnvProvider):
    kind = KIND

    def __init__(self, env_id: str, args: Mapping[str, Any], taskset: Any, env_max_turns: int | None, origin: str,
                 cfg: EnvConfig) -> None:
        super().__init__(env_id, args)
        vf = v1()
        self.taskset, self.origin = taskset, origin
        self.task_cls = type(taskset).task_type()
        self.max_turns = min(cfg.max_turns, env_max_turns or cfg.max_turns)
        self.agent_config = vf.AgentConfig.model_validate(
            {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}, "max_turns": self.max_turns})
        check_taskset(env_id, taskset, self.task_cls)
        self._shared = Tools(type(taskset).toolsets(taskset.config), None)
        self._shared_ready: asyncio.Task[None] | None = None
        self._known: dict[str, Any] = {}  # task hash -> the Task the taskset built
        self._rows: dict[str, list[dict[str, Any]]] = {}

    def _taskset_for(self, split: str) -> Any:
        config = self.taskset.config
        if "split" not in type(config).model_fields:
            if split == "train":
                return self.taskset
            raise EnvLoadError(f"env.id={self.env_id}: split {split!r}: taskset {type(self.taskset).__name__} has "
                               "no `split` config field, only the one task list (split=train)")
        if split == "train" and "split" in self.args:
            return self.taskset  # the training split the arguments chose
        from pydantic import ValidationError
        for name in dict.fromkeys([split, *(EVAL_SPLITS if split != "train" else ())]):
            try:
                return type(self.taskset)(type(config).model_validate({**config.model_dump(), "split": name}))
            except ValidationError:
                continue
        raise EnvLoadError(f"env.id={self.env_id}: taskset {type(self.taskset).__name__} has no split {split!r}")

    def tasks(self, split: str = "train") -> list[dict[str, Any]] | None:
        if split not in self._rows:
            rows = []
            for task in self._taskset_for(split):
                data = task.data  # the fields the taskset set; the rest are TaskData's defaults again in task_for
                check_data(data)
                row = data.model_dump(mode="json", exclude_none=True, include=data.model_fields_set)
                self._known[task.hash] = task
                rows.append(row)
            self._rows[split] = rows
        return [dict(row) for row in self._rows[split]]

    def task_for(self, row: Mapping[str, Any]) -> Any:
        """The Task of one of tasks()' rows, else one built from a dataset row the way the taskset builds its own."""
        from verifiers.v1.task import task_key
        data = self.task_cls.data_type().model_validate(dict(row))
        known = self._known.get(task_key(data.model_dump(mode="json", exclude_none=True)))
        if known is not None:
            return known
        if self.taskset.system_prompt is not None:
            data = data.model_copy(update={"system_prompt": self.taskset.system_prompt})
        return self.task_cls(data, self.taskset.config.task)

    async def shared_tools(self) -> Tools:
        """The taskset's toolsets, set up once (as the library serves them once per eval) by the first episode."""
        ready = self._shared_ready
        if ready is None:
            ready = self._shared_ready = asyncio.ensure_future(self._shared.start())
        if not ready.done():
            await asyncio.shield(ready)  # an episode timing out does not cancel the set-up the others wait on
        ready.result()
        return self._shared

    def episode(self) -> VerifiersEpisode:
        return VerifiersEpisode(self)

    def describe(self) -> str:
        return f"verifiers:{self.env_id} ({self.origin}; null harness, max_turns={self.max_turns})"

    async def aclose(self) -> None:
        if self._shared_ready is not None:
            await self._shared.close()


class VerifiersEpisode:
    """One rollout of the null harness: the request it would send, the turns committed to a vf.Trace."""

    def __init__(self, provider: VerifiersProvider) -> None:
        self.p = provider
        self.task: Any = None
        self.trace: Any = None
        self.session: Any = None
        self.request: Any = None
        self.tools: list[Tools] = []
        self.dispatch: dict[str, Tools] = {}
        self.own: Tools | None = None

    async def reset(self, task: Mapping[str, Any]) -> Observation:
        from verifiers.v1.clients import ModelContext
        from verifiers.v1.configs.client import EvalClientConfig
        from verifiers.v1.session import RolloutLimits, RolloutSession, hook_boundary
        from verifiers.v1.state import state_cls
        from verifiers.v1.utils.decorators import discover_decorated, invoke
        vf = v1()
        self.task = t = self.p.task_for(task)
        check_data(t.data)
        self.trace = vf.Trace(task=vf.TraceTask(type=type(t).__name__, data=t.data, key=t.key, hash=t.hash),
                              state=state_cls(type(t))(), agent=vf.AgentInfo(config=self.p.agent_config))
        stops = [(hook_boundary(fn, allow_trace=True), fn) for fn in t.hooks("stop")]
        hooks = [(hook_boundary(fn, allow_trace=False), fn) for fn in discover_decorated(t, "intercept")]
        self.session = RolloutSession(
            ctx=ModelContext(model="slimecli-policy", client=EvalClientConfig()), trace=self.trace,
            limits=RolloutLimits(max_turns=self.p.max_turns), gates_tools=True,
            trace_stops=[fn for b, fn in stops if b is vf.Trace],
            request_stops=[fn for b, fn in stops if b is vf.Request],
            response_stops=[fn for b, fn in stops if b is vf.Response],
            request_interceptors=[fn for b, fn in hooks if b is vf.Request],
            response_interceptors=[fn for b, fn in hooks if b is vf.Response])
        if type(t).setup is not vf.Task.setup:
            result = invoke(t.setup, {"trace": self.trace})
            if inspect.isawaitable(result):
                await result
        self.own = Tools(type(t).toolsets(t.config), t.data)
        self.tools = [await self.p.shared_tools(), self.own]
        await self.own.start()
        for host in self.tools:
            for name in host.dispatch:
                if name in self.dispatch:
                    raise EnvLoadError(f"tool {name!r} is both taskset-scoped and task-scoped")
                self.dispatch[name] = host
        schemas = [s for host in self.tools for s in host.schemas]
        data = t.data
        messages: list[Any] = [vf.SystemMessage(content=data.system_prompt)] if data.system_prompt else []
        messages += [vf.UserMessage(content=data.prompt)] if isinstance(data.prompt, str) else list(data.prompt)
        tools = [vf.Tool(name=s["function"]["name"], description=s["function"]["description"],
                         parameters=s["function"]["parameters"]) for s in schemas]
        stopped = await self._next_request(vf.Request(messages=messages, tools=tools or None))
        if stopped:
            raise RuntimeError(f"the task's stop {stopped!r} ended the episode before the first turn")
        return Observation(messages=[_wire(m) for m in self.request.messages], tools=schemas or None)

    async def _next_request(self, request: Any) -> str | None:
        """What the interception does before each model call: limits and @stop, then the request hooks."""
        from verifiers.v1 import graph
        stopped = await self.session.refused()
        if stopped:
            return str(stopped)
        request, records, stopped = await self.session.rewrite_request(request)
        self.trace.request_rewrites.extend(records)
        if stopped:
            graph.prepare_turn(self.trace, request.messages, request.tools).commit_prompt()
            self.trace.stop(stopped)
            return str(stopped)
        self.request = request
        return None

    async def step(self, action: Action) -> StepResult:
        from verifiers.v1 import graph
        from verifiers.v1.harnesses.utils.compaction import bound_tool_message
        vf, session = v1(), self.session
        calls = [vf.ToolCall(id=c.id, name=c.name, arguments=json.dumps(c.arguments, ensure_ascii=False))
                 for c in action.tool_calls]
        message = vf.AssistantMessage(content=action.content, reasoning_content=action.reasoning or None,
                                      tool_calls=calls or None)
        response = vf.Response(id=f"slimecli-{uuid.uuid4().hex}", created=int(time.time()), model="slimecli-policy",
                               message=message, finish_reason="tool_calls" if calls else "stop")
        stopped = None
        if session.response_interceptors or session.response_stops:
            response, records, stopped = await session.rewrite_response(response)
            self.trace.response_rewrites.extend(records)
        turn = graph.prepare_turn(self.trace, self.request.messages, self.request.tools)
        node = turn.commit(response)
        session.consume_prepared(turn.tail)
        stopped = stopped or await session.gate_tool_calls(node)
        if stopped:
            self.trace.stop(stopped)
            return await self._finish()
        reply = response.message
        if not reply.tool_calls:  # the chat loop ends on a reply without tool calls
            return await self._finish()
        history = [*self.request.messages, reply]
        results = []
        gated = bool(session.request_interceptors or session.request_stops)
        for call in reply.tool_calls:
            try:
                args = json.loads(call.arguments or "{}")
            except json.JSONDecodeError:
                args = call.arguments
            if gated:
                verdict = await session.decide_tool(call.id, call.name, args)
                if verdict["action"] == "stop":
                    return await self._finish()
                if verdict["action"] == "deny":
                    results.append(vf.ToolMessage.model_validate(bound_tool_message(verdict["message"])))
                    continue
            if not isinstance(args, dict):
                content = f"error: tool arguments must be a JSON object, got {type(args).__name__}"
            elif call.name in self.dispatch:
                content = await self.dispatch[call.name].call(call.name, args, self.trace)
            else:
                content = f"error: unknown tool {call.name!r}"
            tool_message = {"role": "tool", "tool_call_id": call.id, "content": content, "name": call.name}
            results.append(vf.ToolMessage.model_validate(bound_tool_message(tool_message)))
        if await self._next_request(vf.Request(messages=[*history, *results], tools=self.request.tools)):
            return await self._finish()
        return StepResult(Observation(messages=[_wire(m) for m in self.request.messages[len(history):]]))

    async def _finish(self) -> StepResult:
        """The rollout's close: the task's finalize, then its rewards and metrics over the trace."""
        from verifiers.v1.utils.decorators import invoke
        vf, trace, t = v1(), self.trace, self.task
        if type(t).finalize is not vf.Task.finalize:
            result = invoke(t.finalize, {"trace": trace})
            if inspect.isawaitable(result):
                await result
        await t.score(trace, None)
        trace.is_completed, trace.ok = True, True
        reward = float(trace.reward)
        if not math.isfinite(reward):
            raise ValueError(f"the task's reward is {reward}")
        info = {"rewards": {k: (r.score if r else None) for k, r in trace.rewards.items()},
                "metrics": dict(trace.metrics), "stop": trace.stop_condition or "completed",
                "turns": trace.num_turns}
        return StepResult(Observation(), reward=reward, done=True, info=info)

    async def close(self) -> None:
        if self.own is not None:
            own, self.own = self.own, None
            await own.close()


def _wire(message: Any) -> dict[str, Any]:
    """A vf message in OpenAI chat form, content a string."""
    out: dict[str, Any] = {"role": message.role, "content": text(message.content, f"a {message.role} message")}
    if message.role == "assistant":
        if message.reasoning_content:
            out["reasoning_content"] = message.reasoning_content
        if message.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in message.tool_calls]
    elif message.role == "tool":
        out["tool_call_id"] = message.tool_call_id
        if message.name:
            out["name"] = message.name
    return out
