"""What slimecli can play of a verifiers taskset, checked at load: one policy seat in the null harness (chat and
in-process tools), text only, no runtime (container, sandboxed tools, hooks reading the task's box), no LLM judges,
a bounded task list. Each refusal is an EnvLoadError that says what the taskset needs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from slimecli.env.adapters import library
from slimecli.env.provider import EnvLoadError

KIND = "verifiers"


def v1() -> Any:
    """`verifiers.v1`, imported when first needed."""
    return library(KIND, "verifiers.v1", "the verifiers library (0.4, the v1 stack)")


def text(content: Any, where: str) -> str:
    """A message's content as text; images are refused."""
    if isinstance(content, str) or content is None:
        return content or ""
    if any(getattr(part, "type", "text") != "text" for part in content):
        raise EnvLoadError(f"{where} has non-text content (images): slimecli's rollout is text chat only")
    return "\n".join(part.text for part in content)


def check_data(data: Any) -> None:
    """What a task row needs to be played here: a prompt in text, no container image."""
    where = f"task {data.idx if data.idx is not None else data.name or ''}".rstrip()
    if data.image:
        raise EnvLoadError(f"{where} runs in the image {data.image!r}, which needs a container")
    if data.prompt is None:
        raise EnvLoadError(f"{where} has no prompt (a user would open the conversation): unsupported")
    if not isinstance(data.prompt, str):
        for message in data.prompt:
            text(message.content, f"{where}'s prompt")


def check_env(env_id: str, env: Any) -> None:
    """An Env plays here only as a SingleAgentEnv of the library's own run, with the null harness."""
    vf = v1()
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


def check_taskset(env_id: str, taskset: Any, task_cls: Any) -> None:
    """A taskset plays here when its tasks need no runtime, no judge and no remote or sandboxed toolset."""
    vf, task_config = v1(), taskset.config.task
    name = task_cls.__name__
    if not taskset.bounded:
        raise _refuse(env_id, f"taskset {type(taskset).__name__} is endless (INFINITE); it has no task list")
    if task_cls.NEEDS_CONTAINER:
        raise _refuse(env_id, f"task {name} needs a container (NEEDS_CONTAINER)")
    for hook in ("setup", "finalize"):
        fn = getattr(task_cls, hook)
        if fn is not getattr(vf.Task, hook) and _needs_runtime(fn):
            raise _refuse(env_id, f"task {name}.{hook} needs a runtime (the task's box)")
    from verifiers.v1.utils.loaders import plugged_fn
    for attr, plugged in (("reward", task_config.rewards), ("metric", task_config.metrics)):
        fns = [(n, f) for k in task_cls.__mro__ for n, f in vars(k).items() if callable(f) and hasattr(f, attr)]
        fns += [(n, plugged_fn(spec.fn)) for n, spec in plugged.items() if spec.fn]
        for fn_name, fn in fns:
            if _needs_runtime(fn):
                raise _refuse(env_id, f"task {name}'s @vf.{attr} {fn_name!r} needs a runtime (it reads the box)")
    if task_config.judges:
        raise _refuse(env_id, f"task {name} is scored by judges ({len(task_config.judges)}), which call a model")
    servers = [*task_cls.toolsets(task_config), *type(taskset).toolsets(taskset.config)]
    for server in servers:
        cfg: Any = getattr(server, "config", None)
        if getattr(cfg, "url", None):
            raise _refuse(env_id, f"toolset {type(server).__name__} is a remote server ({cfg.url})")
        runtime = getattr(cfg, "runtime", None)
        if runtime is not None and not isinstance(runtime, vf.SubprocessConfig):
            raise _refuse(env_id, f"toolset {type(server).__name__} runs in a {runtime.type} runtime (a sandbox)")


def _refuse(env_id: str, why: str) -> EnvLoadError:
    return EnvLoadError(f"env.id={env_id}: {why}; slimecli plays verifiers tasks without a runtime "
                        "(the null harness: chat and in-process tools)")


def _needs_runtime(fn: Callable[..., Any]) -> bool:
    """A hook that declares `runtime` without a default reads or runs things in the task's box."""
    param = inspect.signature(fn).parameters.get("runtime")
    return param is not None and param.default is inspect.Parameter.empty
