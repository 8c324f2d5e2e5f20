"""Compose a run config from Hydra groups, a recipe and overrides; validate it; freeze it.

Group choices (`optimizer=adam`, `+recipe=opd`) go through Hydra. Value overrides
(`optimizer.lr=1e-6`) are applied afterwards so that every bad key is reported
together instead of Hydra stopping at the first one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from slimecli.config import recipes as recipe_lib
from slimecli.config.errors import ConfigError, ConfigErrors, allowed_hint, did_you_mean
from slimecli.config.paths import conf_dir, group_members
from slimecli.config.schema import GROUPS, SlimeConfig

AGENT_ENV = "SWE_AGENT"
AGENT_ENV_CHOICES = ("claude_code", "codex")


@dataclass
class _Parsed:
    groups: dict[str, str]
    recipe: recipe_lib.Recipe | None
    values: list[tuple[str, Any]]


def _parse(overrides: list[str], recipe_dirs: tuple[str, ...], errors: list[ConfigError]) -> _Parsed:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    parsed = _Parsed({}, None, [])
    for text in overrides:
        try:
            (ov,) = parser.parse_overrides([text])
        except OverrideParseException as exc:
            errors.append(ConfigError(text, text, "cannot parse override", str(exc).splitlines()[0]))
            continue
        key = ov.key_or_group
        if ov.is_delete():
            errors.append(ConfigError(key, text, "deleting keys is not supported", "set the key to a value or null"))
        elif key == "recipe":
            spec = str(ov.value())
            recipe = recipe_lib.resolve(spec, recipe_dirs)
            if recipe is None:
                errors.append(ConfigError("recipe", spec, "unknown recipe",
                                          allowed_hint(spec, recipe_lib.available(recipe_dirs))))
            parsed.recipe = recipe
        elif key in GROUPS and "." not in key:
            member = ov.value()
            members = group_members(key)
            if not isinstance(member, str) or member not in members:
                errors.append(ConfigError(key, member, f"unknown {key} option", allowed_hint(str(member), members)))
            else:
                parsed.groups[key] = member
        elif key.startswith("hydra"):
            errors.append(ConfigError(key, text, "hydra settings cannot be overridden here"))
        else:
            parsed.values.append((key, ov.value()))
    return parsed


def _env_agent(errors: list[ConfigError]) -> str | None:
    value = os.environ.get(AGENT_ENV)
    if value is None or value == "":
        return None
    if value not in AGENT_ENV_CHOICES:
        errors.append(ConfigError(f"${AGENT_ENV}", value, "unknown agent in environment variable",
                                  allowed_hint(value, AGENT_ENV_CHOICES)))
        return None
    return value


def _hydra_compose(groups: dict[str, str], recipe: recipe_lib.Recipe | None) -> dict[str, Any]:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    overrides = [f"{g}={m}" for g, m in groups.items()]
    tmp = None
    try:
        if recipe is not None:
            tmp = Path(tempfile.mkdtemp(prefix="slimecli-recipe-"))
            (tmp / "recipe").mkdir()
            os.symlink(recipe.path, tmp / "recipe" / f"{recipe.name}.yaml")
            overrides += [f"hydra.searchpath=[file://{tmp}]", f"+recipe={recipe.name}"]
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None, job_name="slimecli"):
            cfg = compose(config_name="config", overrides=overrides)
        data = OmegaConf.to_container(cfg, resolve=True)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    assert isinstance(data, dict)
    data.pop("hydra", None)
    if recipe is not None:
        data["recipe"] = recipe.name
    return cast(dict[str, Any], data)


def _set_path(data: dict[str, Any], path: str, value: Any, errors: list[ConfigError]) -> None:
    node: Any = data
    parts = path.split(".")
    for i, part in enumerate(parts[:-1]):
        if not isinstance(node, dict) or part not in node:
            where = ".".join(parts[:i])
            keys = list(node) if isinstance(node, dict) else []
            errors.append(ConfigError(path, value, "unknown key",
                                      did_you_mean(part, keys, f"{where}." if where else "")))
            return
        node = node[part]
    if not isinstance(node, dict):
        errors.append(ConfigError(path, value, "cannot set a key inside a non-mapping value"))
        return
    node[parts[-1]] = value


def _implied_groups(data: dict[str, Any], parsed: _Parsed, env_agent: str | None, uses_agent: bool) -> dict[str, str]:
    """Group members that follow from others unless the command line picks them.

    SWE_AGENT picks the agent of a run that uses one (above the recipe, below the command line), so
    the frozen config always names the agent that actually runs; SWE tasks are graded by their tests.
    """
    implied: dict[str, str] = {}
    agent = data.get("agent", {}).get("name")
    task = data.get("task", {}).get("name")
    if env_agent and "agent" not in parsed.groups and agent != env_agent and (
            agent not in (None, "none") or uses_agent or task == "swe"):
        implied["agent"] = env_agent
    reward = data.get("reward", {}).get("name")
    if task == "swe" and "reward" not in parsed.groups and reward != "swe_tests":
        implied["reward"] = "swe_tests"
    if reward == "swe_tests" and "task" not in parsed.groups and task != "swe":
        implied["task"] = "swe"
    return implied


def compose_dict(overrides: list[str], recipe_dirs: tuple[str, ...] = (), uses_agent: bool = False
                 ) -> tuple[dict[str, Any], list[ConfigError]]:
    """The composed plain dict and the errors found while composing (not yet schema-checked).

    `uses_agent`: the command runs an agent (`agent run|serve`), so SWE_AGENT applies even when the
    composed config says agent=none.
    """
    errors: list[ConfigError] = []
    parsed = _parse(list(overrides), recipe_dirs, errors)
    env_agent = _env_agent(errors)
    data = _hydra_compose(parsed.groups, parsed.recipe)
    implied = _implied_groups(data, parsed, env_agent, uses_agent)
    if implied:
        data = _hydra_compose({**parsed.groups, **implied}, parsed.recipe)
    for path, value in parsed.values:
        _set_path(data, path, value, errors)
    return data, errors


def load(overrides: Sequence[str] = (), recipe_dirs: tuple[str, ...] = (), uses_agent: bool = False) -> SlimeConfig:
    """Compose, check the schema and every rule; raise ConfigErrors with all of them at once."""
    from slimecli.config.convert import build
    from slimecli.config.rules import check_all

    data, errors = compose_dict(list(overrides), tuple(recipe_dirs), uses_agent)
    cfg = build(SlimeConfig, data, "", errors)
    if cfg is not None:
        errors.extend(check_all(cfg))
    if errors or cfg is None:
        raise ConfigErrors(errors)
    return cfg
