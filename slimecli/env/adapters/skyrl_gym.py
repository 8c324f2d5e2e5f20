"""SkyRL-Gym environments (`skyrl_gym.make`) behind the native protocol, built from dataset rows as SkyRL builds them.

A SkyRL dataset row carries the prompt (chat messages, or a string here), the env_class that runs it and the fields
its environment reads (reward_spec, extra_info, anything custom). As in SkyRL's generator, every field but the
prompt and env_class goes to the environment as `extras` (with `max_turns` set from env.max_turns), env.args.env_config
is its `env_config` (an omegaconf DictConfig, as SkyRL passes it), `init(prompt)` gives the first messages and each
`step` gets the policy's raw text: SkyRL environments parse tool calls and answers themselves, so no tools are offered.

env.id is a registered id (skyrl_gym's registry, after importing the modules in env.args.module, which register
theirs), `pkg.module:Name` (a BaseTextEnv subclass or creator in that module, or an id that importing the module
registers), and it is the env_class of rows that name none. A row's own env_class, where registered, wins (SkyRL's
per-sample routing); such an environment gets an empty env_config.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
from collections.abc import Mapping
from typing import Any

from slimecli.config.errors import did_you_mean
from slimecli.config.groups.env import EnvConfig
from slimecli.env.adapters import library
from slimecli.env.protocol import Action, Observation, StepResult
from slimecli.env.provider import EnvLoadError, EnvNotFound, EnvProvider

KIND = "skyrl_gym"
ARGS = ("env_config", "module", "prompt_key", "env_class_key")


def available() -> list[tuple[str, str]]:
    try:
        import skyrl_gym
    except ImportError:
        return []
    return [(env_id, _where(spec)) for env_id, spec in sorted(skyrl_gym.registry.items())]


def _where(spec: Any) -> str:
    entry = spec.entry_point
    if isinstance(entry, str):
        return entry
    return f"{getattr(entry, '__module__', '?')}:{getattr(entry, '__qualname__', repr(entry))}"


def _import(module: str, what: str) -> Any:
    """The module, or None where it (or a package above it) does not exist; a module that exists but fails to
    import is a load error, not a missing environment."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            return None
        raise EnvLoadError(f"env={KIND}: importing {module!r} ({what}) failed: {exc}") from exc
    except Exception as exc:
        raise EnvLoadError(f"env={KIND}: importing {module!r} ({what}) failed: {type(exc).__name__}: {exc}") from exc


def _modules(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    raise EnvLoadError(f"env={KIND}: env.args.module must be a module name or a list of them, not {value!r}")


def _resolve(sg: Any, env_id: str) -> Any:
    """The EnvSpec that env.id names."""
    if env_id in sg.registry:
        return sg.registry[env_id]
    known = sorted(sg.registry)
    if ":" not in env_id:
        raise EnvNotFound(KIND, env_id, known, "not registered in skyrl_gym; import the package that registers it "
                          "with env.args.module=PKG, or give pkg.module:Class")
    module_name, _, attr = env_id.rpartition(":")
    module = _import(module_name, "env.id") if module_name else None
    if module is None:
        raise EnvNotFound(KIND, env_id, known, f"no module {module_name!r}")
    if hasattr(module, attr):
        target = getattr(module, attr)
        if isinstance(target, type) and not issubclass(target, sg.Env):
            raise EnvLoadError(f"env={KIND}: {env_id} is a class but not a skyrl_gym Env (subclass "
                               "skyrl_gym.envs.base_text_env.BaseTextEnv)")
        if not callable(target):
            raise EnvLoadError(f"env={KIND}: {env_id} is not an environment class or creator")
        return sg.envs.registration.EnvSpec(id=env_id, entry_point=target)
    if attr in sg.registry:  # gym's `module:env_id`: the module registers the id when imported
        return sg.registry[attr]
    raise EnvNotFound(KIND, env_id, sorted(sg.registry),
                      f"module {module_name!r} has no {attr!r} and registered no environment of that id")


def load(env_id: str, args: Mapping[str, Any], cfg: EnvConfig) -> EnvProvider:
    sg: Any = library(KIND, "skyrl_gym", "the skyrl-gym library")
    for key in args:
        if key not in ARGS:
            hint = did_you_mean(key, ARGS)
            hint = f" ({hint})" if hint else ""
            raise EnvLoadError(f"env={KIND}: unknown argument env.args.{key}{hint}; allowed: {', '.join(ARGS)}")
    env_config = args.get("env_config") or {}
    if not isinstance(env_config, Mapping):
        raise EnvLoadError(f"env={KIND}: env.args.env_config must be a mapping (the environment's env_config), "
                           f"not {type(env_config).__name__}")
    for key in ("prompt_key", "env_class_key"):
        if not isinstance(args.get(key, "x"), str):
            raise EnvLoadError(f"env={KIND}: env.args.{key} must be a string")
    for module in _modules(args.get("module")):
        if _import(module, "env.args.module") is None:
            raise EnvLoadError(f"env={KIND}: env.args.module: no module {module!r} is installed")
    return SkyRLGymProvider(env_id, args, _resolve(sg, env_id), dict(env_config), cfg)


def _config(env_config: Mapping[str, Any]) -> Any:
    """SkyRL hands environments an omegaconf DictConfig (attribute access: env_config.db_path)."""
    try:
        from omegaconf import OmegaConf
    except ImportError:
        return dict(env_config)
    return OmegaConf.create(dict(env_config))


class SkyRLGymProvider(EnvProvider):
    kind = KIND

    def __init__(self, env_id: str, args: Mapping[str, Any], spec: Any, env_config: dict[str, Any],
                 cfg: EnvConfig) -> None:
        super().__init__(env_id, args)
        self.spec, self.env_config, self.cfg = spec, env_config, cfg
        self.prompt_key = str(args.get("prompt_key", "prompt"))
        self.env_class_key = str(args.get("env_class_key", "env_class"))

    def describe(self) -> str:
        return f"{KIND}:{self.env_id} ({_where(self.spec)})"

    def episode(self) -> SkyRLGymEpisode:
        return SkyRLGymEpisode(self)

    def build(self, task: Mapping[str, Any]) -> tuple[Any, list[dict[str, Any]]]:
        """A new environment for the row, and the prompt to init it with."""
        import skyrl_gym

        keys = sorted(map(str, task))
        if self.prompt_key not in task:
            raise ValueError(f"skyrl_gym row has no {self.prompt_key!r} (chat messages or a string); its keys: {keys}")
        prompt = _messages(task[self.prompt_key], f"the row's {self.prompt_key!r}")
        env_class = task.get(self.env_class_key)
        spec, env_config = self.spec, self.env_config
        if env_class and env_class != self.spec.id:
            if env_class in skyrl_gym.registry:
                spec, env_config = skyrl_gym.registry[env_class], {}
            elif ":" not in self.env_id:  # an explicit pkg.module:Class runs rows whatever class they name
                raise ValueError(f"skyrl_gym row's {self.env_class_key} {env_class!r} is not registered (registered: "
                                 f"{', '.join(sorted(skyrl_gym.registry))}); import its package with env.args.module")
        extras = {k: copy.deepcopy(v) for k, v in task.items() if k not in (self.prompt_key, self.env_class_key)}
        extras["max_turns"] = self.cfg.max_turns  # as SkyRL's generator: its max_turns, for every environment
        try:
            env = skyrl_gym.make(spec, env_config=_config(env_config), extras=extras)
        except Exception as exc:
            raise ValueError(f"skyrl_gym environment {spec.id!r} rejected the row (keys {keys}): "
                             f"{type(exc).__name__}: {exc}") from exc
        return env, prompt


def _messages(value: Any, what: str) -> list[dict[str, Any]]:
    """Chat messages as SkyRL's ConversationType: a string is one user message."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if hasattr(value, "tolist"):  # a parquet/numpy column
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{what} must be a list of chat messages or a string, not {type(value).__name__}")
    out = []
    for m in value:
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise ValueError(f"{what}: each message needs a 'role' and 'content', got {m!r}")
        msg = dict(m)
        content = msg.get("content")
        msg["content"] = "" if content is None else content if isinstance(content, str) else str(content)
        out.append(msg)
    return out


class SkyRLGymEpisode:
    """One SkyRL environment instance: made at reset from the row, closed with the episode."""

    def __init__(self, provider: SkyRLGymProvider) -> None:
        self.provider = provider
        self.env: Any = None

    async def reset(self, task: Mapping[str, Any]) -> Observation:
        self.env, prompt = await asyncio.to_thread(self.provider.build, task)
        first, _ = await asyncio.to_thread(self.env.init, prompt)
        return Observation(messages=_messages(first, "init()'s messages"), tools=None)

    async def step(self, action: Action) -> StepResult:
        if self.env is None:
            raise RuntimeError("step() before reset()")
        out = await asyncio.to_thread(self.env.step, action.text)
        if not isinstance(out, Mapping):
            raise TypeError(f"skyrl_gym step() returned {type(out).__name__}, not a BaseTextEnvStepOutput")
        reward = out.get("reward")
        if reward is None or isinstance(reward, str) or not hasattr(reward, "__float__"):
            raise TypeError(f"skyrl_gym step() returned reward {reward!r}, not a number")
        done = bool(out.get("done"))
        info: dict[str, Any] = {"metadata": out.get("metadata") or {}}
        if out.get("postprocessed_action") is not None:
            info["postprocessed_action"] = out["postprocessed_action"]
        if done and hasattr(self.env, "get_metrics"):
            info["env_metrics"] = await asyncio.to_thread(self.env.get_metrics)
        observation = Observation(messages=_messages(out.get("observations") or [], "step()'s observations"))
        return StepResult(observation=observation, reward=float(reward), done=done, info=info)

    async def close(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            await asyncio.to_thread(env.close)
