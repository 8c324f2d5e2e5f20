"""Agent rules: the custom (harness, adapter) pair, the tool parser, URLs and constrained decoding."""

from __future__ import annotations

from slimecli.config.errors import ConfigError
from slimecli.config.registry import AGENTS
from slimecli.config.schema import SlimeConfig

KNOWN_PARSERS = ("qwen", "hermes")


def pair(cfg: SlimeConfig) -> list[ConfigError]:
    a = cfg.agent
    if bool(a.harness) != bool(a.adapter):
        missing = "agent.adapter" if a.harness else "agent.harness"
        return [ConfigError(missing, None, "a custom agent needs both agent.harness and agent.adapter (import paths)")]
    if a.name != "none" and a.name not in AGENTS.names() and not a.harness:
        return [ConfigError("agent.name", a.name, f"unknown agent; valid: {', '.join(AGENTS.names())}, or set "
                            "agent.harness and agent.adapter to import paths")]
    return []


def parser(cfg: SlimeConfig) -> list[ConfigError]:
    p = cfg.agent.tool_parser
    if p not in KNOWN_PARSERS and "." not in p and ":" not in p:
        return [ConfigError("agent.tool_parser", p, f"must be {' or '.join(KNOWN_PARSERS)}, or an import path "
                            "package.module:Class")]
    return []


def urls(cfg: SlimeConfig) -> list[ConfigError]:
    a = cfg.agent
    errors = []
    if a.engine_url and not a.engine_url.startswith(("http://", "https://")):
        errors.append(ConfigError("agent.engine_url", a.engine_url, "must start with http:// or https://"))
    return errors


def constrain(cfg: SlimeConfig) -> list[ConfigError]:
    a = cfg.agent
    errors = []  # agent.constrain and agent.choices_then are Literals: the decoder checks their values
    if a.constrain == "choices" and a.choices_then == "final" and not a.choices_final:
        errors.append(ConfigError("agent.choices_final", a.choices_final, "must be a non-empty text when "
                                  "agent.choices_then=final (the turn after the chosen tool ran)"))
    if a.choices_file is not None and a.constrain != "choices":
        errors.append(ConfigError("agent.choices_file", a.choices_file, "only used with agent.constrain=choices",
                                  "set agent.constrain=choices, or drop agent.choices_file"))
    return errors


RULES = [pair, parser, urls, constrain]
