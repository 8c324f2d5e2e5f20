"""OpenEnv (openenv-core) environments: a server app made with OpenEnv's `create_app`, run locally, one WebSocket
session per episode.

env.id names the app: an installed OpenEnv package (`openenv-<name>`: `echo_env`, `echo`, `echo-env`; its
openenv.yaml `app`, else `<module>.server.app:app`), an importable package in OpenEnv's layout (`my_env` ->
`my_env.server.app:app`), or `pkg.module:app`. load() starts the app's server (server.py) and reads its Action and
Observation schemas; each episode is its own WebSocket session (episode.py); aclose() stops the server.

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

import importlib.metadata
import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slimecli.config.import_path import find_module_spec
from slimecli.env.adapters import install_hint
from slimecli.env.adapters.openenv.episode import KIND, OpenEnvEpisode, OpenEnvProvider
from slimecli.env.adapters.openenv.server import Server, get_json
from slimecli.env.provider import EnvLoadError, EnvNotFound, EnvProvider

if TYPE_CHECKING:
    from slimecli.config.groups.env import EnvConfig

__all__ = ["OpenEnvEpisode", "OpenEnvProvider", "available", "load"]

_ARGS = ("env_vars", "reset_kwargs", "url", "workers", "startup_timeout_s", "action_field", "observation_field",
         "system_prompt")
_NOT_SHOWN = {"reward", "done", "metadata"}  # carried beside an observation's fields, not in them


def available() -> list[tuple[str, str]]:
    if importlib.util.find_spec("openenv") is None:
        return []
    return sorted((module, f"package {dist} {version}") for module, (dist, version, _) in _installed().items())


def load(env_id: str, args: Mapping[str, Any], cfg: EnvConfig) -> EnvProvider:
    if importlib.util.find_spec("openenv") is None or importlib.util.find_spec("websockets") is None:
        raise EnvLoadError(f"env={KIND} needs openenv-core: {install_hint(KIND)}")
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
    server: Server | None = None
    app: str | None = None
    if "url" in args:
        base_url = str(args["url"]).rstrip("/")
        if not base_url.startswith(("http://", "https://")):
            raise EnvLoadError(f"env.args.url: must be an http(s):// URL, got {base_url!r}")
    else:
        app = _resolve(env_id)
        server = Server(app, {k: str(v) for k, v in env_vars.items()}, workers)
        base_url = server.start(float(startup_s))
    try:
        schemas = get_json(f"{base_url}/schema", 10.0)
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


def _mapping(args: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = args.get(key) or {}
    if not isinstance(value, Mapping):
        raise EnvLoadError(f"env.args.{key}: must be a mapping, got {type(value).__name__}")
    return {str(k): v for k, v in value.items()}


# ---- what the policy fills: the Action and Observation schemas -------------------------------------------------


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
        if _exists(module):
            return env_id
        raise EnvNotFound(KIND, env_id, sorted(installed), detail=f"no module {module}")
    base = env_id.strip().replace("-", "_")
    stem = base[:-4] if base.endswith("_env") else base
    for key in (base, f"{stem}_env", stem):
        if key in installed:
            return installed[key][2]
    if _exists(base):
        return f"{base}.server.app:app" if _exists(f"{base}.server.app") else f"{base}:app"
    detail = "not an installed openenv-* package, an importable package with server/app.py, nor pkg.module:app"
    if "/" in env_id:
        detail += "; Hugging Face Spaces are not fetched: pip install the package, or run it and set env.args.url"
    raise EnvNotFound(KIND, env_id, sorted(installed), detail=detail)


def _exists(dotted: str) -> bool:
    """Importable, as far as the files tell (nothing is imported)."""
    return find_module_spec(dotted) is not None
