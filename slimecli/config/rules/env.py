"""RL environment rules (env=...): what an environment run needs and what it replaces. The environment's reward is
the reward and its episodes are the rollout, so another reward, rollout kind, agent or SWE task given with it is
refused with the reason. Whether env.id loads is a pre-flight check (slimecli/env/check.py)."""

from __future__ import annotations

from slimecli.config.errors import ConfigError, allowed_hint
from slimecli.config.import_path import is_import_path, syntax_error
from slimecli.config.registry import ENVIRONMENTS
from slimecli.config.schema import SlimeConfig

PARSERS = ("hermes", "qwen")  # slimecli.model.tool_calls.PARSERS, or an import path


def _on(cfg: SlimeConfig) -> bool:
    return cfg.env.name != "none"


def environment(cfg: SlimeConfig) -> list[ConfigError]:
    e = cfg.env
    if e.name == "none":
        if e.id is not None or e.mix:
            key, value = ("env.id", e.id) if e.id is not None else ("env.mix", "[...]")
            return [ConfigError(key, value, "applies to an environment", "pick one: env=native|verifiers|openenv|"
                                "skyrl_gym|reasoning_gym (or env=mix with env.mix)")]
        return []
    if e.name == "mix":
        if not e.mix:
            return [ConfigError("env.mix", "[]", "env=mix needs a list of sources",
                                "env.mix=[{name: a, env: native, id: lookup}, ...]")]
        if e.id is not None:
            return [ConfigError("env.id", e.id, "env=mix takes its environments from env.mix", "drop env.id")]
        errors = []
        seen: set[str] = set()
        for i, m in enumerate(e.mix):
            if m.name in seen:
                errors.append(ConfigError(f"env.mix[{i}].name", m.name, "names another source too",
                                          "every source of a mix needs its own label"))
            seen.add(m.name)
            if m.env == "native":
                errors += _native_id(m.id, f"env.mix[{i}].id")
        return errors
    if e.mix:
        return [ConfigError("env.mix", "[...]", f"applies to env=mix, not env={e.name}", "set env=mix")]
    if not e.id:
        return [ConfigError("env.id", e.id, f"env={e.name} needs the environment to load",
                            "slimecli env list shows what is installed")]
    return _native_id(e.id, "env.id") if e.name == "native" else []


def _native_id(value: str, key: str) -> list[ConfigError]:
    if is_import_path(value):
        problem = syntax_error(value)
        return [ConfigError(key, value, f"cannot find the environment: {problem}")] if problem else []
    if ENVIRONMENTS.knows(value):
        return []
    return [ConfigError(key, value, "unknown environment",
                        allowed_hint(value, ENVIRONMENTS.names()) + ", or pkg.module:Name")]


def replaces(cfg: SlimeConfig) -> list[ConfigError]:
    """What an environment takes the place of."""
    if not _on(cfg):
        errors = []
        if cfg.reward.name == "env":
            errors.append(ConfigError("reward.name", "env", "reward=env is the reward of an environment's episodes",
                                      "pick an environment: env=native env.id=lookup"))
        if cfg.rollout.generate == "env":
            errors.append(ConfigError("rollout.generate", "env", "runs an environment's episodes",
                                      "pick an environment: env=native env.id=lookup"))
        return errors
    errors = []
    if cfg.reward.name != "env":
        errors.append(ConfigError("reward.name", cfg.reward.name, f"cannot be given with env={cfg.env.name}: the "
                                  "environment's reward is the reward", "drop reward=..."))
    if cfg.rollout.generate != "env":
        errors.append(ConfigError("rollout.generate", cfg.rollout.generate, f"env={cfg.env.name} runs the "
                                  "environment's episodes (rollout.generate=env)", "drop rollout.generate"))
    if cfg.agent.name != "none":
        errors.append(ConfigError("agent.name", cfg.agent.name, "coding agents do not run in an RL environment "
                                  "(env=...)", "agent=none, or env=none for coding-agent RL"))
    if cfg.task.name == "swe":
        errors.append(ConfigError("task.name", "swe", "SWE tasks are worked by coding agents, not env=...",
                                  "task=jsonl task.path=ROWS for environments that take dataset rows"))
    return errors


def parser(cfg: SlimeConfig) -> list[ConfigError]:
    p = cfg.env.tool_parser
    if p in PARSERS or (is_import_path(p) and syntax_error(p) is None):
        return []
    return [ConfigError("env.tool_parser", p, "unknown tool parser", allowed_hint(p, list(PARSERS))
                        + ", or pkg.module:Class")]


RULES = [environment, replaces, parser]
