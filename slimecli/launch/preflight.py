"""Pre-flight: the checks of a run that need this machine or the model files, shared by every command that
would start one (`train`, `plan`, `config validate`), so that a configuration `train` refuses is refused by
the others with the same message. The checks that need only the config are the rules in slimecli.config.rules.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

from slimecli.config.errors import ConfigError, ConfigErrors
from slimecli.config.schema import SlimeConfig

# No tokenizer packs more than this many characters into one token on average (English prose and code run
# 3-4): the bound turns a CLI's measured prompt size into a token count that is never an over-estimate.
CHARS_PER_TOKEN_MAX = 6


def materialize(cfg: SlimeConfig) -> SlimeConfig:
    """Make model paths concrete (model=tiny is created on first use) so workers never re-resolve."""
    if cfg.model.path is None:
        from slimecli.model.loading import resolve_model_path

        cfg = replace(cfg, model=replace(cfg.model, path=str(resolve_model_path(cfg.model))))
    return cfg


def check(cfg: SlimeConfig) -> None:
    """Raise ConfigErrors with every problem found."""
    errors = machine_errors(cfg)
    if not errors:
        errors = model_errors(cfg)
    if errors:
        raise ConfigErrors(errors)


def machine_errors(cfg: SlimeConfig) -> list[ConfigError]:
    """Back-ends this machine cannot run, and agent runs it cannot host."""
    errors = []
    if cfg.trainer.name == "megatron":
        if importlib.util.find_spec("megatron") is None:
            errors.append(ConfigError("trainer", "megatron", "megatron-core is not installed",
                                      "pip install 'slimecli[megatron]' on a GPU machine, or use trainer=torch"))
        errors.append(ConfigError("trainer", "megatron", "the megatron-core training loop is not in this release "
                                  "(only its stateless Adam patch is: slimecli.train.optim.megatron_patch)",
                                  "use trainer=torch"))
    if cfg.rollout.name == "sglang" and importlib.util.find_spec("sglang") is None:
        errors.append(ConfigError("rollout", "sglang", "sglang is not installed",
                                  "pip install 'slimecli[sglang]' on a GPU machine, or use rollout=local"))
    return errors + agent_errors(cfg)


def agent_errors(cfg: SlimeConfig) -> list[ConfigError]:
    """Training with a coding agent: the agent rollout kind, a CLI this machine can run, a sandbox that starts
    here, and a context window that holds the CLI's own prompt."""
    if cfg.task.name != "swe" and cfg.agent.name == "none" and cfg.rollout.generate != "agent":
        return []
    if cfg.rollout.generate != "agent":
        return [ConfigError("rollout.generate", cfg.rollout.generate, "training on SWE tasks or with an agent runs "
                            "the agent rollout", "add rollout.generate=agent (or start from +recipe=swe_agent)")]
    errors = []
    from slimecli.agent.install import PACKAGES, locate

    a = cfg.agent
    if not a.harness and a.name in PACKAGES and locate(a.name, a.binary, a.tools_dir) is None:
        where = f"agent.binary={a.binary} is not an executable" if a.binary else f"the {a.name} CLI is not installed"
        errors.append(ConfigError("agent", a.name, where, f"run `slimecli agent install {a.name}` (or set agent.binary)"))
    problem = sandbox_problem(cfg)
    if problem:
        errors.append(ConfigError("sandbox", cfg.sandbox.name, problem, "install or start it, or use sandbox=auto"))
    errors += context_errors(cfg)
    return errors


def sandbox_problem(cfg: SlimeConfig) -> str | None:
    kind = cfg.sandbox.name
    if kind == "bwrap":
        from slimecli.sandbox.bwrap import available

        return available()
    if kind in ("docker", "podman"):
        from slimecli.sandbox.container import runtime_missing

        return runtime_missing(kind, cfg.sandbox.binary)
    return None


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
    from slimecli.agent.registry import resolve

    try:
        _, harness, _ = resolve(cfg.agent.name, cfg.agent.harness, cfg.agent.adapter)
    except (ValueError, ImportError, AttributeError):
        return []  # the agent rules report a bad name or import path
    window = context_len(cfg)
    floor = getattr(harness, "prompt_chars_min", 0) // CHARS_PER_TOKEN_MAX
    if window is None or not floor or window >= floor + cfg.agent.max_new_tokens:
        return []
    key = "agent.max_context_len" if cfg.agent.max_context_len is not None else "model"
    return [ConfigError(key, window, f"the {cfg.agent.name} CLI's own prompt takes at least {floor} tokens, so a "
                        f"{window}-token window leaves no room for agent.max_new_tokens={cfg.agent.max_new_tokens}",
                        f"a context of at least {floor + cfg.agent.max_new_tokens} tokens")]


def model_errors(cfg: SlimeConfig) -> list[ConfigError]:
    """Checks that read the model files (the teacher must share the student's tokenizer)."""
    teacher = cfg.teacher.model_path
    if cfg.teacher.name == "server" and teacher and not cfg.teacher.url:
        from slimecli.teacher.client import check_tokenizers_compatible

        cfg = materialize(cfg)
        problem = check_tokenizers_compatible(cfg.model.resolved_tokenizer_path, teacher)
        if problem:
            return [ConfigError("teacher.model_path", teacher, problem)]
    return []
