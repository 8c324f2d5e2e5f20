"""Pre-flight checks of a run with a coding agent: its CLI is installed here, its sandbox starts, the context
window holds the CLI's own prompt, and every SWE task's environment gives the test runner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from slimecli.config.errors import ConfigError, allowed_hint
from slimecli.config.schema import SlimeConfig

if TYPE_CHECKING:
    from rich.console import Console

# No tokenizer packs more than this many characters into one token on average (English prose and code run
# 3-4): the bound turns a CLI's measured prompt size into a token count that is never an over-estimate.
CHARS_PER_TOKEN_MAX = 6



def agent_errors(cfg: SlimeConfig) -> list[ConfigError]:
    """Training with a coding agent: the agent rollout kind, a CLI this machine can run, a sandbox that starts
    here, and a context window that holds the CLI's own prompt (SWE eval datasets alone: the CLI and sandbox)."""
    if cfg.task.name != "swe" and cfg.agent.name == "none" and cfg.rollout.generate != "agent":
        if any(ds.task == "swe" for ds in cfg.eval.datasets):  # evaluated by the agent CLI, in sandboxes
            return agent_cli_errors(cfg) + sandbox_errors(cfg)
        return []
    if cfg.rollout.generate != "agent":
        return [ConfigError("rollout.generate", cfg.rollout.generate, "training on SWE tasks or with an agent runs "
                            "the agent rollout", "add rollout.generate=agent (or start from +recipe=swe_agent)")]
    return agent_cli_errors(cfg) + sandbox_errors(cfg) + context_errors(cfg) + task_env_errors(cfg)


MAX_ENV_ERRORS = 10  # tasks named in full; the rest are counted


def task_env_errors(cfg: SlimeConfig) -> list[ConfigError]:
    """Every SWE task (or task.instance) has an environment that gives the test runner: built already, or
    buildable here (installer present, cache writable, disk not full, no failed build on record). Nothing is
    built; `slimecli tasks env build` builds ahead of a run."""
    if cfg.task.name != "swe" or not cfg.task.path:
        return []
    from slimecli.swe.env.build import installer_problem
    from slimecli.swe.env.resolve import EnvUnavailable, host_spec, plan_task, store_for
    from slimecli.swe.task import TaskFileError, load_for

    try:
        tasks = [t for t in load_for(cfg.task).tasks if cfg.task.instance in (None, t.instance_id)]
    except TaskFileError:
        return []  # the task rules said so already
    store = store_for(cfg.task)
    problems: list[tuple[str, str]] = []  # (instance_id, why)
    checked: dict[str, str | None] = {}  # key -> problem
    for task in tasks:
        try:
            chosen = plan_task(task, cfg.task, cfg.sandbox)
        except EnvUnavailable as exc:
            problems.append((task.instance_id, f"env:{exc.reason}: {exc.detail}"))
            continue
        spec = chosen.spec if chosen.kind == "venv" else host_spec(cfg.task) if chosen.kind == "host" else None
        if spec is None:
            continue
        key = spec.key()
        if key not in checked:
            failed = store.last_failure(key)
            checked[key] = (None if store.ready(key) is not None
                            else f"its last build failed: {failed}" if failed
                            else installer_problem(spec.installer) or store.build_problem())
        if checked[key]:
            problems.append((task.instance_id, f"{chosen.kind} environment {key} ({chosen.why}): {checked[key]}"))
    errors = [ConfigError("task.environment", cfg.task.environment, f"task {iid}: {why}")
              for iid, why in problems[:MAX_ENV_ERRORS]]
    if len(problems) > MAX_ENV_ERRORS:
        errors.append(ConfigError("task.environment", cfg.task.environment,
                                  f"... and {len(problems) - MAX_ENV_ERRORS} more tasks"))
    if errors:
        errors[-1] = ConfigError(errors[-1].path, errors[-1].value, errors[-1].reason,
                                 "`slimecli tasks env build` builds (and retries) them and shows the log; "
                                 "`slimecli tasks check` checks each task")
    return errors


def agent_cli_errors(cfg: SlimeConfig) -> list[ConfigError]:
    """The agent's CLI is installed here (or agent.binary is an executable); custom harnesses bring their own."""
    from slimecli.agent.harness.install import PACKAGES, locate

    a = cfg.agent
    if a.harness or a.name not in PACKAGES or locate(a.name, a.binary, a.tools_dir) is not None:
        return []
    where = f"agent.binary={a.binary} is not an executable" if a.binary else f"the {a.name} CLI is not installed"
    return [ConfigError("agent", a.name, where, f"run `slimecli agent install {a.name}` (or set agent.binary)")]


def sandbox_errors(cfg: SlimeConfig) -> list[ConfigError]:
    """The sandbox starts here; sandbox=auto where none does is refused (it never falls back to local)."""
    problem = sandbox_problem(cfg)
    if problem:
        from slimecli.sandbox.factory import hint

        return [ConfigError("sandbox", cfg.sandbox.name, problem, hint(cfg.sandbox))]
    return []


def runs_model_code(cfg: SlimeConfig) -> bool:
    """Whether `train` (or `eval`) of `cfg` runs model-written commands: an agent, SWE tasks, SWE eval datasets."""
    return (cfg.task.name == "swe" or cfg.agent.name != "none" or cfg.rollout.generate == "agent"
            or any(ds.task == "swe" for ds in cfg.eval.datasets))


def sandbox_notice(cfg: SlimeConfig) -> tuple[str, str] | None:
    """(level, text) a command says when it starts, where `cfg` runs model-written code (sandbox.factory.notice):
    a warning with what sandbox=local leaves open, or the kind sandbox=auto picked."""
    return _notice(cfg) if runs_model_code(cfg) else None


def say_sandbox_notice(cfg: SlimeConfig, console: Console, runs_code: bool | None = None,
                       warnings_only: bool = False) -> None:
    """What every command that runs model-written code says when it starts (sandbox_notice): ``warning: ...`` for
    sandbox=local. ``runs_code``: whether it does, where the command knows better than the config (eval's SWE
    datasets)."""
    if runs_code is False:
        return
    from rich.markup import escape

    said = sandbox_notice(cfg) if runs_code is None else _notice(cfg)
    if said is not None and (said[0] == "warning" or not warnings_only):
        level, text = said
        console.print(f"[yellow]warning:[/] {escape(text)}" if level == "warning" else escape(text))


def _notice(cfg: SlimeConfig) -> tuple[str, str] | None:
    from slimecli.sandbox.factory import notice

    return notice(cfg.sandbox)


def sandbox_problem(cfg: SlimeConfig) -> str | None:
    from slimecli.sandbox.factory import unavailable

    return unavailable(cfg.sandbox)


def context_len(cfg: SlimeConfig) -> int | None:
    """The window the agent adapter renders into: agent.max_context_len, else the model's own."""
    if cfg.agent.max_context_len is not None:
        return cfg.agent.max_context_len
    if cfg.model.path is None:
        return cfg.model.max_position_embeddings  # the tiny model slimecli creates
    try:
        config = json.loads((Path(cfg.model.path) / "config.json").read_text())
    except (OSError, ValueError):
        return None  # a hub id or an unreadable config: the engine reports it
    value = config.get("max_position_embeddings") or config.get("max_sequence_length")
    return int(value) if value else None


def context_errors(cfg: SlimeConfig) -> list[ConfigError]:
    """agent.tools names tools the CLI has, and the context window holds the CLI's own prompt."""
    from slimecli.agent.registry import resolve

    try:
        _, harness, _ = resolve(cfg.agent.name, cfg.agent.harness, cfg.agent.adapter)
    except (ValueError, ImportError, AttributeError):
        return []  # the agent rules report a bad name or import path
    if cfg.agent.tools is not None:
        errors = tools_errors(cfg, getattr(harness, "builtin_tools", ()))
        if errors:
            return errors
    chars = getattr(harness, "prompt_chars_min" if cfg.agent.tools is None else "prompt_chars_min_no_tools", 0)
    window = context_len(cfg)
    floor = chars // CHARS_PER_TOKEN_MAX
    if window is None or not floor or window >= floor + cfg.agent.max_new_tokens:
        return []
    key = "agent.max_context_len" if cfg.agent.max_context_len is not None else "model"
    return [ConfigError(key, window, f"the {cfg.agent.name} CLI's own prompt takes at least {floor} tokens, so a "
                        f"{window}-token window leaves no room for agent.max_new_tokens={cfg.agent.max_new_tokens}",
                        f"a context of at least {floor + cfg.agent.max_new_tokens} tokens")]


def tools_errors(cfg: SlimeConfig, known: tuple[str, ...]) -> list[ConfigError]:
    """A tool list only for a CLI that takes one, and only names it has (a misspelt name would leave the
    model without that tool, silently)."""
    if not known:
        return [ConfigError("agent.tools", list(cfg.agent.tools or ()), f"the {cfg.agent.name} CLI takes no list "
                            "of built-in tools", "leave agent.tools unset (null)")]
    errors = []
    for i, name in enumerate(cfg.agent.tools or ()):
        if name not in known:
            errors.append(ConfigError(f"agent.tools[{i}]", name, f"not a built-in tool of the {cfg.agent.name} CLI",
                                      allowed_hint(name, known)))
    return errors
