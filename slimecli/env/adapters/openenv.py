"""OpenEnv (openenv-core) environments: a server app made with OpenEnv's `create_app`, run locally, one WebSocket
session per episode.

env.id names the app: an installed OpenEnv package (`openenv-<name>`: `echo_env`, `echo`, `echo-env`; its
openenv.yaml `app`, else `<module>.server.app:app`), an importable package in OpenEnv's layout (`my_env` ->
`my_env.server.app:app`), or `pkg.module:app`. load() starts `python -m uvicorn <app> --host 127.0.0.1 --port <free>`
in its own process group and waits for /health; aclose() ends the group (SIGTERM, SIGKILL after 5 s). OpenEnv's
UVProvider does not fit: it needs a uv project checkout (`uv run --isolated`), binds 0.0.0.0 and stops only its
child. The client speaks the /ws protocol with `websockets` (OpenEnv's own transport): importing openenv.core costs
~3 s (gradio), and the HTTP /reset and /step endpoints are stateless (a fresh environment per request), so only
/ws keeps an episode's state. Each episode is its own session; where the server is at its max_concurrent_envs
(CAPACITY_REACHED), an episode waits for a free session.

env.args (OpenEnv's conventions: configuration through the server's environment variables, as AutoEnv.from_env's
env_vars; per-episode parameters as reset() keyword arguments, as EnvClient.reset(**kwargs)):
  env_vars           {NAME: value} for the server process (e.g. MAX_CONCURRENT_ENVS, where the app reads it)
  reset_kwargs       keyword arguments of every reset(); the task row's fields are added (the row wins). The
                     server drops those reset() does not accept.
  url                an OpenEnv server already running: nothing is started (env.id is then only a label)
  workers            uvicorn worker processes (default 1): more sessions for apps with max_concurrent_envs=1
  startup_timeout_s  how long the server may take to answer /health (default 60)
  action_field       the Action's string field the policy's text fills (default: its only string field)
  observation_field  the observation field shown to the policy (default: its only string field, else all as JSON)
  system_prompt      a system message before the first observation

Actions: an app whose Action is CallToolAction (or the bare Action) is an MCP tool environment: reset lists its
tools (a list_tools step) as OpenAI function schemas, each tool call is a call_tool step answered by a "tool" message,
a turn without a tool call ends the episode. Otherwise the policy's text (reasoning and tool calls removed) fills
the Action's one string field; an Action needing more than that is refused at load. The first user message is the
task row's `prompt` (if any) followed by the reset observation. Rewards and done come from each step's observation
(None: 0.0).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slimecli.env.protocol import Action, Observation, StepResult, tool_result
from slimecli.env.provider import EnvLoadError, EnvNotFound, EnvProvider

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

    from slimecli.config.groups.env import EnvConfig

KIND = "openenv"
_INSTALL = "pip install 'slimecli[openenv]'"
_ARGS = ("env_vars", "reset_kwargs", "url", "workers", "startup_timeout_s", "action_field", "observation_field",
         "system_prompt")
_NOT_SHOWN = {"reward", "done", "metadata"}  # carried beside an observation's fields, not in them
_GRACE_S = 5.0
_log = logging.getLogger(__name__)
_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy


def available() -> list[tuple[str, str]]:
    if importlib.util.find_spec("openenv") is None:
        return []
    return sorted((module, f"package {dist} {version}") for module, (dist, version, _) in _installed().items())


def load(env_id: str, args: Mapping[str, Any], cfg: EnvConfig) -> EnvProvider:
    if importlib.util.find_spec("openenv") is None or importlib.util.find_spec("websockets") is None:
        raise EnvLoadError(f"env=openenv needs openenv-core: {_INSTALL}")
    unknown = sorted(set(args) - set(_ARGS))
    if unknown:
        raise EnvLoadError(f"env.args.{unknown[0]}: not an argument of env=openenv (allowed: {', '.join(_ARGS)})")
    env_vars = _mapping(args, "env_vars")
    for name, value in env_vars.items():
        if not isinstance(value, str | int | float | bool):
            raise EnvLoadError(f"env.args.env_vars.{name}: must be a string or number, got {type(value).__name__}")
    reset_kwargs = _mapping(args, "reset_kwargs")
    workers, startup_s = args.get("workers", 1), args.get("startup_timeout_s", 60.0)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise EnvLoadError(f"env.args.workers: must be an integer >= 1, got {workers!r}")
    if isinstance(startup_s, bool) or not isinstance(startup_s, int | float) or startup_s <= 0:
        raise EnvLoadError(f"env.args.startup_timeout_s: must be a number > 0, got {startup_s!r}")
    for key in ("url", "action_field", "observation_field", "system_prompt"):
        if key in args and not (isinstance(args[key], str) and args[key]):
            raise EnvLoadError(f"env.args.{key}: must be a non-empty string, got {args[key]!r}")
    server: _Server | None = None
    app: str | None = None
    if "url" in args:
        base_url = str(args["url"]).rstrip("/")
        if not base_url.startswith(("http://", "https://")):
            raise EnvLoadError(f"env.args.url: must be an http(s):// URL, got {base_url!r}")
    else:
        app = _resolve(env_id)
        server = _Server(app, {k: str(v) for k, v in env_vars.items()}, workers)
        base_url = server.start(float(startup_s))
    try:
        schemas = _get_json(f"{base_url}/schema", 10.0)
        mode, action_field = _action_mode(env_id, schemas.get("action") or {}, args.get("action_field"))
        observation_field = args.get("observation_field") or (
            _only_str_field(schemas.get("observation") or {}, _NOT_SHOWN) if mode == "text" else None)
    except BaseException:
        if server is not None:
            server.stop()
        raise
    return OpenEnvProvider(env_id, args, app=app, base_url=base_url, server=server, mode=mode,
                           action_field=action_field, observation_field=observation_field,
                           reset_kwargs=reset_kwargs, timeout_s=cfg.timeout_s)


class OpenEnvProvider(EnvProvider):
    kind = KIND

    def __init__(self, env_id: str, args: Mapping[str, Any], *, app: str | None, base_url: str, server: _Server | None,
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
            except Exception:  # already closed by the server: nothing to release
                pass
            await ws.close()

    async def _open(self, reset_data: dict[str, Any]) -> dict[str, Any]:
        """Connect and reset; a server at capacity is retried until a session frees or 90% of env.timeout_s."""
        from websockets.asyncio.client import connect

        url = self.p.base_url.replace("http", "ws", 1) + "/ws"
        loopback = any(h in url for h in ("://127.0.0.1", "://localhost", "://[::1]"))
        loop = asyncio.get_running_loop()
        deadline, delay = loop.time() + 0.9 * self.p.timeout_s, 0.05
        message = {"type": "reset", "data": json.loads(json.dumps(reset_data, default=str))}
        while True:
            self._ws = await connect(url, proxy=None if loopback else True, max_size=100 * 2**20,
                                     open_timeout=self.p.timeout_s)
            try:
                return await self._exchange(message)
            except _AtCapacity as e:
                await self.close()
                self.p.capacity_reached(e.args[0])
                if loop.time() + delay > deadline:
                    raise RuntimeError(f"openenv:{self.p.env_id}: the server stayed at its session limit "
                                       f"({e.args[0].get('max_sessions', '?')}) for {0.9 * self.p.timeout_s:.0f} s; "
                                       "raise its max_concurrent_envs or env.args.workers") from None
                await asyncio.sleep(delay)
                delay = min(2 * delay, 0.5)
            except Exception:
                await self.close()  # the session is not the rollout's yet: release it here
                raise

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


def _action_mode(env_id: str, schema: Mapping[str, Any], chosen: str | None) -> tuple[str, str | None]:
    """("mcp", None) for tool environments, ("text", field) where one string field takes the policy's text."""
    props = {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"}
    if not props or {"tool_name", "arguments"} <= set(props):
        return "mcp", None
    required = set(schema.get("required") or ())
    strings = [k for k, v in props.items() if _is_str(v)]
    field = chosen or (strings[0] if len(strings) == 1 else None)
    others = sorted(required - {field})
    if field is None or field not in strings or others:
        title = schema.get("title", "Action")
        fields = ", ".join(f"{k}{'*' if k in required else ''}" for k in props)
        why = (f"env.args.action_field={chosen!r} is not one of its string fields ({', '.join(strings) or 'none'})"
               if chosen and chosen not in strings else
               f"it also requires {', '.join(others)}" if field and others else
               f"it has {len(strings)} string fields: set env.args.action_field to one of them" if strings else
               "it has no string field")
        raise EnvLoadError(f"openenv:{env_id}: its action {title} ({fields}; * required) cannot be filled from the "
                           f"policy's text: {why}. slimecli fills an Action with one string field (message, text, "
                           "code, ...) or calls an MCP environment's tools (CallToolAction)")
    return "text", field


def _only_str_field(schema: Mapping[str, Any], skip: set[str]) -> str | None:
    strings = [k for k, v in (schema.get("properties") or {}).items() if k not in skip and _is_str(v)]
    return strings[0] if len(strings) == 1 else None


def _is_str(prop: Mapping[str, Any]) -> bool:
    if prop.get("type") == "string":
        return "const" not in prop and "enum" not in prop
    options = prop.get("anyOf") or ()
    return any(o.get("type") == "string" for o in options) and all(o.get("type") in ("string", "null") for o in options)


def _mapping(args: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = args.get(key) or {}
    if not isinstance(value, Mapping):
        raise EnvLoadError(f"env.args.{key}: must be a mapping, got {type(value).__name__}")
    return {str(k): v for k, v in value.items()}


def _get_json(url: str, timeout: float) -> dict[str, Any]:
    try:
        with _direct.open(url, timeout=timeout) as response:
            body = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise EnvLoadError(f"env=openenv: {url} did not answer as an OpenEnv server: {e}") from e
    return body if isinstance(body, dict) else {}


# ---- finding the app -------------------------------------------------------------------------------------------


def _installed() -> dict[str, tuple[str, str, str]]:
    """module -> (distribution, version, app) of the installed `openenv-<name>` packages, as OpenEnv discovers them."""
    found: dict[str, tuple[str, str, str]] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] or ""
        if not name.lower().startswith(("openenv-", "openenv_")) or name.lower().replace("_", "-") == "openenv-core":
            continue
        module = name[len("openenv-"):].replace("-", "_")
        app = "server.app:app"
        manifest = Path(str(dist.locate_file(f"{module}/openenv.yaml")))
        if manifest.is_file():
            import yaml

            try:
                app = str((yaml.safe_load(manifest.read_text()) or {}).get("app") or app)
            except (yaml.YAMLError, OSError, AttributeError):
                pass
        found[module] = (name, dist.version, app if app.startswith(f"{module}.") else f"{module}.{app}")
    return found


def _resolve(env_id: str) -> str:
    """env.id -> the `module:attribute` of its server app, without importing it (a package's __init__ may pull
    all of openenv.core in)."""
    installed = _installed()
    if ":" in env_id:
        module = env_id.split(":", 1)[0]
        if _module_exists(module):
            return env_id
        raise EnvNotFound(KIND, env_id, sorted(installed), detail=f"no module {module}")
    base = env_id.strip().replace("-", "_")
    stem = base[:-4] if base.endswith("_env") else base
    for key in (base, f"{stem}_env", stem):
        if key in installed:
            return installed[key][2]
    if _module_exists(base):
        return f"{base}.server.app:app" if _module_exists(f"{base}.server.app") else f"{base}:app"
    detail = "not an installed openenv-* package, an importable package with server/app.py, nor pkg.module:app"
    if "/" in env_id:
        detail += "; Hugging Face Spaces are not fetched: pip install the package, or run it and set env.args.url"
    raise EnvNotFound(KIND, env_id, sorted(installed), detail=detail)


def _module_exists(dotted: str) -> bool:
    """Whether `dotted` is importable, looking at the files (only the top-level package is located)."""
    parts = dotted.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    places = [Path(p) for p in spec.submodule_search_locations or ()]
    for i, part in enumerate(parts[1:], start=2):
        packages = [p / part for p in places if (p / part).is_dir()]
        if packages:
            places = packages
            continue
        return i == len(parts) and any((p / f"{part}.py").is_file() or any(p.glob(f"{part}.*.so")) for p in places)
    return True


# ---- the server process ----------------------------------------------------------------------------------------


def _kill_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the server's process group (uvicorn's workers too), SIGKILL what is left after grace_s."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        deadline = time.monotonic() + wait_s
        try:
            os.killpg(proc.pid, sig)
            while time.monotonic() < deadline:
                proc.poll()  # reap the leader: a zombie still counts as a member of the group
                os.killpg(proc.pid, 0)
                time.sleep(0.05)
        except ProcessLookupError:
            return


class _Server:
    """`python -m uvicorn <app>` on a free loopback port, in its own process group."""

    def __init__(self, app: str, env_vars: dict[str, str], workers: int) -> None:
        self.app, self.env_vars, self.workers = app, env_vars, workers
        self.proc: subprocess.Popen[bytes] | None = None
        fd, log = tempfile.mkstemp(prefix="slimecli-openenv-", suffix=".log")
        os.close(fd)
        self.log = Path(log)
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def start(self, timeout_s: float) -> str:
        env = {**os.environ, **self.env_vars}
        # the child imports what this process can (sys.path entries a test or a notebook added included)
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(
            [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p] + [p for p in sys.path if p]))
        for attempt in range(3):  # a port picked free can be taken before uvicorn binds it
            port = _free_port()
            command = [sys.executable, "-m", "uvicorn", self.app, "--host", "127.0.0.1", "--port", str(port),
                       "--log-level", "warning"] + (["--workers", str(self.workers)] if self.workers > 1 else [])
            with self.log.open("wb") as log:
                self.proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
            if self._finalizer is not None:
                self._finalizer.detach()
            self._finalizer = weakref.finalize(self, _kill_group, self.proc, 1.0)
            base_url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                try:
                    with _direct.open(f"{base_url}/health", timeout=1.0) as response:
                        if response.status == 200:
                            return base_url
                except (urllib.error.URLError, OSError):
                    pass
                time.sleep(0.1)
            code, tail = self.proc.poll(), self.tail()
            if code is not None and "address already in use" in tail.lower() and attempt < 2:
                continue
            self.stop()
            why = f"did not answer /health within {timeout_s:g} s" if code is None else f"exited with code {code}"
            raise EnvLoadError(f"env=openenv: the server of {self.app} {why}:\n{tail}")
        raise AssertionError("unreachable")

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None:
            _kill_group(self.proc, _GRACE_S)
        if self._finalizer is not None:
            self._finalizer.detach()
        self.log.unlink(missing_ok=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
