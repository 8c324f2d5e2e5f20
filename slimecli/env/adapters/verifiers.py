"""env=verifiers: tasksets written for the Prime Environments Hub library (verifiers 0.4, `import verifiers.v1 as vf`),
played turn by turn by slimecli's policy.

env.id is what `vf-eval` takes: an installed taskset package's id (`gsm8k-v1`, `owner/gsm8k-v1@0.1.0`, a built-in
`verifiers.v1.tasksets` name), loaded with `vf.load_environment`; or `pkg.module:attr` naming a Taskset class, a
Taskset or SingleAgentEnv object, or a function returning one. env.args are the taskset's config fields
(`--env.taskset.*`). The episode is the library's `null` harness (the plain chat loop): the task's prompt, the tools
of its toolsets (run in process, named `<server>_<tool>` as the harness sees them), until a reply without tool calls.
The library's own RolloutSession polices each turn (its @vf.stop, @vf.intercept, max_turns), the turns go into a real
vf.Trace, and the last step's reward is `Task.score` over it: the weighted sum of its @vf.reward methods.

Refused at load (EnvLoadError): Envs whose run() plays agents itself (multi-agent, judged, user-simulated), tasksets
that ship their own harness program, tasks needing a runtime (container, setup/reward/metric taking `runtime`),
LLM judges, remote or containerised tool servers, endless tasksets.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import math
import pkgutil
import re
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from slimecli.config.groups.env import EnvConfig
from slimecli.env.protocol import Action, Observation, StepResult
from slimecli.env.provider import EnvLoadError, EnvNotFound, EnvProvider

_INSTALL = "pip install 'slimecli[verifiers]'"
_EVAL_SPLITS = ("test", "validation", "eval", "val", "dev")
# the episode whose tool call is running: a toolset's state is that episode's trace.state (the library's /state)
_TRACE: contextvars.ContextVar[Any] = contextvars.ContextVar("slimecli_verifiers_trace", default=None)


def _vf() -> Any:
    try:
        return importlib.import_module("verifiers.v1")
    except ImportError as exc:
        raise EnvLoadError(f"env=verifiers needs the verifiers library (0.4, the v1 stack): {_INSTALL} ({exc})") from exc


def _needs_runtime(fn: Callable[..., Any]) -> bool:
    """A hook that declares `runtime` without a default reads or runs things in the task's box."""
    param = inspect.signature(fn).parameters.get("runtime")
    return param is not None and param.default is inspect.Parameter.empty


def _args_error(env_id: str, exc: Exception, prefix: tuple[str, ...] = ()) -> EnvLoadError:
    errors = exc.errors() if hasattr(exc, "errors") else []
    parts = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ())]
        loc = loc[len(prefix):] if tuple(loc[:len(prefix)]) == prefix else loc
        parts.append(f"env.args{''.join('.' + p for p in loc)}: {err.get('msg')}")
    return EnvLoadError(f"env.id={env_id}: bad arguments: " + ("; ".join(parts) or str(exc)))


def _text(content: Any, where: str) -> str:
    if isinstance(content, str) or content is None:
        return content or ""
    if any(getattr(part, "type", "text") != "text" for part in content):
        raise EnvLoadError(f"{where} has non-text content (images): slimecli's rollout is text chat only")
    return "\n".join(part.text for part in content)


def _check_data(data: Any) -> None:
    """What a task row needs to be played here: a prompt in text, no container image."""
    where = f"task {data.idx if data.idx is not None else data.name or ''}".rstrip()
    if data.image:
        raise EnvLoadError(f"{where} runs in the image {data.image!r}, which needs a container")
    if data.prompt is None:
        raise EnvLoadError(f"{where} has no prompt (a user would open the conversation): unsupported")
    if not isinstance(data.prompt, str):
        for message in data.prompt:
            _text(message.content, f"{where}'s prompt")


def _wire(message: Any) -> dict[str, Any]:
    """A vf message in OpenAI chat form, content a string."""
    out: dict[str, Any] = {"role": message.role, "content": _text(message.content, f"a {message.role} message")}
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


def _in_thread(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A sync tool runs in a worker thread (its context, so `self.state`, copied) and never blocks the loop."""
    if inspect.iscoroutinefunction(fn):
        return fn

    @functools.wraps(fn)
    async def run(*args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)
    return run


class _Tools:
    """Toolsets served in process: the MCP server each would run, called directly; tool names and schemas as the
    library's chat harness lists them."""

    def __init__(self, toolsets: list[Any], data: Any | None) -> None:
        self.toolsets, self.data = toolsets, data  # data: the task, for task-scoped servers' setup_task
        self.schemas: list[dict[str, Any]] = []
        self.dispatch: dict[str, tuple[Any, str]] = {}

    async def start(self) -> None:
        import verifiers
        from mcp.server.mcpserver import MCPServer
        from pydantic import TypeAdapter
        from verifiers.v1.mcp.server import ServerBase

        for server in self.toolsets:
            def pull(server: Any = server) -> Any:
                async def _pull() -> Any:
                    trace = _TRACE.get()
                    if trace is None:
                        return server._state_cls()
                    return server._state_adapter.validate_json(TypeAdapter(type(trace.state)).dump_json(trace.state))
                return _pull

            def push(server: Any = server) -> Any:
                async def _push(before: bytes) -> None:
                    trace = _TRACE.get()
                    after = server._state_adapter.dump_json(server.state)
                    if trace is not None and after != before:
                        trace.state = TypeAdapter(type(trace.state)).validate_json(after)
                return _push

            # the library syncs a tool's state over the rollout's /state channel; here the channel is the trace
            server._pull_state, server._push_state = pull(), push()
            server._with_state = functools.partial(lambda srv, fn: ServerBase._with_state(srv, _in_thread(fn)), server)
            await server.setup()
            if self.data is not None:
                await server.setup_task(self.data)
            mcp = MCPServer(server.server_name or type(server).__name__, version=verifiers.__version__)
            server.register(mcp)
            prefix = server.server_name
            for tool in await mcp.list_tools():
                full = f"{prefix}_{tool.name}" if prefix else tool.name
                if full in self.dispatch:
                    raise EnvLoadError(f"duplicate tool name {full!r}: give a toolset a distinct TOOL_PREFIX")
                self.schemas.append({"type": "function", "function": {
                    "name": full, "description": tool.description or "", "parameters": tool.input_schema}})
                self.dispatch[full] = (mcp, tool.name)

    async def call(self, name: str, arguments: dict[str, Any], trace: Any) -> str:
        from verifiers.v1.harnesses.utils.mcp import mcp_content_to_chat_content

        mcp, raw = self.dispatch[name]
        token = _TRACE.set(trace)
        try:
            result = await mcp.call_tool(raw, arguments)
        except Exception as exc:  # the MCP server answers a failing tool with its message
            return str(exc)
        finally:
            _TRACE.reset(token)
        return _text(mcp_content_to_chat_content(result.content), f"tool {name!r}'s result")

    async def close(self) -> None:
        for server in self.toolsets:
            await server._exit_stack.aclose()


class VerifiersProvider(EnvProvider):
    kind = "verifiers"

    def __init__(self, env_id: str, args: Mapping[str, Any], taskset: Any, env_max_turns: int | None, origin: str,
                 cfg: EnvConfig) -> None:
        super().__init__(env_id, args)
        vf = _vf()
        self.taskset, self.origin = taskset, origin
        self.task_cls = type(taskset).task_type()
        self.max_turns = min(cfg.max_turns, env_max_turns or cfg.max_turns)
        self.agent_config = vf.AgentConfig.model_validate(
            {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}, "max_turns": self.max_turns})
        self._check()
        self._shared = _Tools(type(taskset).toolsets(taskset.config), None)
        self._shared_ready: asyncio.Task[None] | None = None
        self._known: dict[str, Any] = {}  # task hash -> the Task the taskset built
        self._rows: dict[str, list[dict[str, Any]]] = {}

    def _refuse(self, why: str) -> EnvLoadError:
        return EnvLoadError(f"env.id={self.env_id}: {why}; slimecli plays verifiers tasks without a runtime "
                            "(the null harness: chat and in-process tools)")

    def _check(self) -> None:
        vf, cls, task_config = _vf(), self.task_cls, self.taskset.config.task
        name = cls.__name__
        if not self.taskset.bounded:
            raise self._refuse(f"taskset {type(self.taskset).__name__} is endless (INFINITE); it has no task list")
        if cls.NEEDS_CONTAINER:
            raise self._refuse(f"task {name} needs a container (NEEDS_CONTAINER)")
        for hook in ("setup", "finalize"):
            fn = getattr(cls, hook)
            if fn is not getattr(vf.Task, hook) and _needs_runtime(fn):
                raise self._refuse(f"task {name}.{hook} needs a runtime (the task's box)")
        from verifiers.v1.utils.loaders import plugged_fn
        for attr, plugged in (("reward", task_config.rewards), ("metric", task_config.metrics)):
            fns = [(n, f) for k in cls.__mro__ for n, f in vars(k).items() if callable(f) and hasattr(f, attr)]
            fns += [(n, plugged_fn(spec.fn)) for n, spec in plugged.items() if spec.fn]
            for fn_name, fn in fns:
                if _needs_runtime(fn):
                    raise self._refuse(f"task {name}'s @vf.{attr} {fn_name!r} needs a runtime (it reads the box)")
        if task_config.judges:
            raise self._refuse(f"task {name} is scored by judges ({len(task_config.judges)}), which call a model")
        servers = [*cls.toolsets(task_config), *type(self.taskset).toolsets(self.taskset.config)]
        for server in servers:
            cfg: Any = getattr(server, "config", None)
            if getattr(cfg, "url", None):
                raise self._refuse(f"toolset {type(server).__name__} is a remote server ({cfg.url})")
            runtime = getattr(cfg, "runtime", None)
            if runtime is not None and not isinstance(runtime, vf.SubprocessConfig):
                raise self._refuse(f"toolset {type(server).__name__} runs in a {runtime.type} runtime (a sandbox)")

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
        for name in dict.fromkeys([split, *(_EVAL_SPLITS if split != "train" else ())]):
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
                _check_data(data)
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

    async def shared_tools(self) -> _Tools:
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
        self.tools: list[_Tools] = []
        self.dispatch: dict[str, _Tools] = {}
        self.own: _Tools | None = None

    async def reset(self, task: Mapping[str, Any]) -> Observation:
        from verifiers.v1.clients import ModelContext
        from verifiers.v1.configs.client import EvalClientConfig
        from verifiers.v1.session import RolloutLimits, RolloutSession, hook_boundary
        from verifiers.v1.state import state_cls
        from verifiers.v1.utils.decorators import discover_decorated, invoke
        vf = _vf()
        self.task = t = self.p.task_for(task)
        _check_data(t.data)
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
        self.own = _Tools(type(t).toolsets(t.config), t.data)
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
        vf, session = _vf(), self.session
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
        vf, trace, t = _vf(), self.trace, self.task
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


def _module_name(env_id: str) -> str:
    return env_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()


def _from_env(env_id: str, env: Any) -> tuple[Any, int | None, str]:
    """A SingleAgentEnv's taskset and its seat's max_turns; any other Env is refused."""
    vf = _vf()
    cls = type(env)
    own = [m for m in ("setup", "run", "finalize") if getattr(cls, m) is not getattr(vf.SingleAgentEnv, m)]
    if not isinstance(env, vf.SingleAgentEnv) or own:
        from verifiers.v1.configs.agent import agent_config_fields
        roles = ", ".join(agent_config_fields(env.config)) or "none"
        raise EnvLoadError(f"env.id={env_id}: {cls.__name__} is an Env whose run() plays its agents itself (roles: "
                           f"{roles}): multi-agent, judged or user-simulated episodes are not supported; slimecli "
                           "plays one policy seat turn by turn (a SingleAgentEnv)")
    agent = env.config.agent
    harness = agent.harness or vf.default_agent_harness(env.config.taskset.id)
    if harness.id != "null" and (agent.harness is not None or harness.id != "bash"):
        raise EnvLoadError(f"env.id={env_id}: the agent's harness is {harness.id!r}, a program that drives the model "
                           "itself (in a sandbox); slimecli plays the null harness (the chat loop) only")
    return env.taskset, agent.max_turns, f"{cls.__name__} over taskset {type(env.taskset).__name__}"


def _from_id(env_id: str, args: Mapping[str, Any]) -> tuple[Any, int | None, str]:
    vf = _vf()
    from pydantic import ValidationError
    try:
        vf.import_taskset(env_id)
    except ModuleNotFoundError as exc:
        missing = getattr(exc.__cause__, "name", None) or ""
        target = _module_name(env_id)
        if not missing or target == missing or target.startswith(missing + "."):
            raise EnvNotFound("verifiers", env_id, [name for name, _ in available()],
                              "no installed taskset package; install it (prime env install / pip install)") from exc
        raise EnvLoadError(f"env.id={env_id}: its package needs {missing!r}, which is not installed") from exc
    except ImportError as exc:
        raise EnvLoadError(f"env.id={env_id}: importing it failed: {exc}") from exc
    try:
        env = vf.load_environment(vf.resolve_env_config({"taskset": {**args, "id": env_id}}))
    except ValidationError as exc:
        raise _args_error(env_id, exc, ("taskset",)) from exc
    except (TypeError, ValueError, AttributeError, ImportError) as exc:
        raise EnvLoadError(f"env.id={env_id}: {exc}") from exc
    taskset, max_turns, origin = _from_env(env_id, env)
    return taskset, max_turns, f"{origin}, package {_module_name(env_id)}"


def _from_ref(env_id: str, args: Mapping[str, Any]) -> tuple[Any, int | None, str]:
    vf = _vf()
    from pydantic import ValidationError
    from verifiers.v1.utils.generic import concrete_type
    module_name, _, attr = env_id.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise EnvNotFound("verifiers", env_id, [name for name, _ in available()],
                              f"no module {module_name}") from exc
        raise EnvLoadError(f"env.id={env_id}: importing {module_name} needs {exc.name!r}: {exc}") from exc
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise EnvNotFound("verifiers", env_id, [name for name, _ in available()], f"{module_name} has no {attr}")
        obj = getattr(obj, part)
    try:
        if isinstance(obj, type) and issubclass(obj, vf.Taskset):
            config_cls = concrete_type(obj, vf.TasksetConfig, origin=vf.Taskset) or vf.TasksetConfig
            obj = obj(config_cls.model_validate(dict(args)))
        elif callable(obj) and not isinstance(obj, vf.Taskset | vf.Env):
            obj = obj(**args)
        elif args:
            raise EnvLoadError(f"env.id={env_id}: {type(obj).__name__} is already built; it takes no env.args")
    except ValidationError as exc:
        raise _args_error(env_id, exc) from exc
    except TypeError as exc:
        raise EnvLoadError(f"env.id={env_id}: bad env.args {sorted(args)}: {exc}") from exc
    if isinstance(obj, vf.Env):
        return _from_env(env_id, obj)
    if isinstance(obj, vf.Taskset):
        return obj, None, f"taskset {type(obj).__name__} from {module_name}"
    raise EnvLoadError(f"env.id={env_id}: gives a {type(obj).__name__}, not a verifiers Taskset or SingleAgentEnv")


def load(env_id: str, args: Mapping[str, Any], cfg: EnvConfig) -> VerifiersProvider:
    _vf()
    source = _from_ref(env_id, args) if ":" in env_id else _from_id(env_id, args)
    return VerifiersProvider(env_id, args, *source, cfg=cfg)


def available() -> list[tuple[str, str]]:
    """Built-in tasksets and installed packages that depend on verifiers, found without importing any."""
    spec = importlib.util.find_spec("verifiers")
    if spec is None or not spec.submodule_search_locations:
        return []
    out: dict[str, str] = {}
    for root in spec.submodule_search_locations:
        for info in pkgutil.iter_modules([str(Path(root) / "v1" / "tasksets")]):
            out.setdefault(info.name, "verifiers built-in taskset")
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] or ""
        requires = [re.split(r"[\s\[<>=!~;(]", req, maxsplit=1)[0].lower() for req in dist.requires or []]
        if name and name.lower() != "verifiers" and "verifiers" in requires:
            try:
                found = importlib.util.find_spec(_module_name(name)) is not None
            except (ImportError, ValueError):
                found = False
            if found:
                out.setdefault(name, f"installed package {name} {dist.version}")
    return sorted(out.items())
