"""A taskset's or a task's toolsets served in process: the MCP server each would run, called directly, with tool
names and schemas as the library's chat harness lists them (`<server>_<tool>`). A toolset's state is the calling
episode's trace.state, which the library would sync over the rollout's /state channel.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
from collections.abc import Callable
from typing import Any

from slimecli.env.adapters.verifiers.checks import text
from slimecli.env.provider import EnvLoadError

# the episode whose tool call is running: a toolset's state is that episode's trace.state (the library's /state)
_TRACE: contextvars.ContextVar[Any] = contextvars.ContextVar("slimecli_verifiers_trace", default=None)


def _in_thread(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A sync tool runs in a worker thread (its context, so `self.state`, copied) and never blocks the loop."""
    if inspect.iscoroutinefunction(fn):
        return fn

    @functools.wraps(fn)
    async def run(*args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)
    return run


class Tools:
    """Toolsets served in process; `dispatch` maps each tool's full name to its MCP server and raw name."""

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
        except Exception as exc:  # noqa: BLE001 - the MCP server answers a failing tool with its message
            return str(exc)
        finally:
            _TRACE.reset(token)
        return text(mcp_content_to_chat_content(result.content), f"tool {name!r}'s result")

    async def close(self) -> None:
        for server in self.toolsets:
            await server._exit_stack.aclose()
