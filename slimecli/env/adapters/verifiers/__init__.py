"""env=verifiers: tasksets written for the Prime Environments Hub library (verifiers 0.4, `import verifiers.v1 as vf`),
played turn by turn by slimecli's policy.

env.id is what `vf-eval` takes: an installed taskset package's id (`gsm8k-v1`, `owner/gsm8k-v1@0.1.0`, a built-in
`verifiers.v1.tasksets` name), loaded with `vf.load_environment`; or `pkg.module:attr` naming a Taskset class, a
Taskset or SingleAgentEnv object, or a function returning one. env.args are the taskset's config fields
(`--env.taskset.*`). The episode (episode.py) is the library's `null` harness (the plain chat loop): the task's
prompt, the tools of its toolsets (run in process, tools.py, named `<server>_<tool>` as the harness sees them), until a
reply without tool calls. The library's own RolloutSession polices each turn (its @vf.stop, @vf.intercept,
max_turns), the turns go into a real vf.Trace, and the last step's reward is `Task.score` over it: the weighted sum of
its @vf.reward methods.

Refused at load (EnvLoadError, checks.py): Envs whose run() plays agents itself (multi-agent, judged,
user-simulated), tasksets that ship their own harness program, tasks needing a runtime (container, setup/reward/metric
taking `runtime`), LLM judges, remote or containerised tool servers, endless tasksets.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import pkgutil
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slimecli.config.groups.env import EnvConfig
from slimecli.env.adapters.verifiers.checks import KIND, check_env, v1
from slimecli.env.adapters.verifiers.episode import VerifiersEpisode, VerifiersProvider
from slimecli.env.provider import EnvLoadError, EnvNotFound

__all__ = ["VerifiersEpisode", "VerifiersProvider", "available", "load"]


def load(env_id: str, args: Mapping[str, Any], cfg: EnvConfig) -> VerifiersProvider:
    v1()
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
        # a hard requirement only: a package with an optional verifiers extra (slimecli itself) is no taskset
        requires = [re.split(r"[\s\[<>=!~;(]", req, maxsplit=1)[0].lower() for req in dist.requires or []
                    if "extra ==" not in req.replace('"', "").replace("'", "")]
        if name and name.lower() != "verifiers" and "verifiers" in requires:
            try:
                found = importlib.util.find_spec(_module_name(name)) is not None
            except (ImportError, ValueError):
                found = False
            if found:
                out.setdefault(name, f"installed package {name} {dist.version}")
    return sorted(out.items())


def _known() -> list[str]:
    return [name for name, _ in available()]


def _module_name(env_id: str) -> str:
    return env_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()


def _from_env(env_id: str, env: Any) -> tuple[Any, int | None, str]:
    """A SingleAgentEnv's taskset and its seat's max_turns; any other Env is refused."""
    check_env(env_id, env)
    return env.taskset, env.config.agent.max_turns, f"{type(env).__name__} over taskset {type(env.taskset).__name__}"


def _from_id(env_id: str, args: Mapping[str, Any]) -> tuple[Any, int | None, str]:
    vf = v1()
    from pydantic import ValidationError
    try:
        vf.import_taskset(env_id)
    except ModuleNotFoundError as exc:
        missing = getattr(exc.__cause__, "name", None) or ""
        target = _module_name(env_id)
        if not missing or target == missing or target.startswith(missing + "."):
            raise EnvNotFound(KIND, env_id, _known(),
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
    vf = v1()
    from pydantic import ValidationError
    from verifiers.v1.utils.generic import concrete_type
    module_name, _, attr = env_id.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise EnvNotFound(KIND, env_id, _known(), f"no module {module_name}") from exc
        raise EnvLoadError(f"env.id={env_id}: importing {module_name} needs {exc.name!r}: {exc}") from exc
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise EnvNotFound(KIND, env_id, _known(), f"{module_name} has no {attr}")
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


def _args_error(env_id: str, exc: Exception, prefix: tuple[str, ...] = ()) -> EnvLoadError:
    errors = exc.errors() if hasattr(exc, "errors") else []
    parts = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ())]
        loc = loc[len(prefix):] if tuple(loc[:len(prefix)]) == prefix else loc
        parts.append(f"env.args{''.join('.' + p for p in loc)}: {err.get('msg')}")
    return EnvLoadError(f"env.id={env_id}: bad arguments: " + ("; ".join(parts) or str(exc)))
