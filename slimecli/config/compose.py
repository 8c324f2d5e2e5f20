"""Compose a run config from Hydra groups, a recipe and overrides; validate it; freeze it.

Group choices (`optimizer=adam`, `+recipe=opd`) go through Hydra. Value overrides
(`optimizer.lr=1e-6`) are applied afterwards so that every bad key is reported
together instead of Hydra stopping at the first one.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from slimecli.config import recipes as recipe_lib
from slimecli.config.canonical import announce, as_written, canonicalize
from slimecli.config.convert import MAX_DEPTH, nesting_depth, schema_paths
from slimecli.config.errors import NO_VALUE, ConfigError, ConfigErrors, allowed_hint
from slimecli.config.paths import conf_dir, group_members
from slimecli.config.schema import GROUPS, SlimeConfig
from slimecli.config.tree import drop, get, has_interpolation, put, set_path

AGENT_ENV = "SWE_AGENT"
# (overrides, recipe_dirs, uses_agent) -> the plain config and the errors found composing it
Composer = Callable[[list[str], tuple[str, ...], bool], tuple[dict[str, Any], list[ConfigError]]]
AGENT_ENV_CHOICES = ("claude_code", "codex")
MAX_OVERRIDE_CHARS = 100_000


@dataclass
class _Parsed:
    groups: dict[str, str]
    recipe: recipe_lib.Recipe | None
    values: list[tuple[str, Any]]


def _parse_one(parser: Any, text: str, errors: list[ConfigError]) -> Any:
    """One override parsed by Hydra's grammar, or None after recording why it cannot be."""
    from hydra.errors import OverrideParseException

    if len(text) > MAX_OVERRIDE_CHARS:
        errors.append(ConfigError(text.partition("=")[0], f"{len(text)} characters",
                                  f"override too long (at most {MAX_OVERRIDE_CHARS} characters)"))
        return None
    if "=" not in text and not text.startswith("~"):  # `slimecli config show trainer`
        errors.append(ConfigError(text, NO_VALUE, "is not an override: use key=value or group=member",
                                  _bare_word_example(text)))
        return None
    try:
        (ov,) = parser.parse_overrides([text])
    except OverrideParseException as exc:
        errors.append(ConfigError(text, text, "cannot parse override", str(exc).splitlines()[0]))
        return None
    except ValueError as exc:  # Python's int digit limit: "Exceeds the limit (4300 digits) ..."
        errors.append(ConfigError(text.partition("=")[0], text.partition("=")[2], "cannot read the value",
                                  str(exc).splitlines()[0]))
        return None
    except RecursionError:
        errors.append(ConfigError(text.partition("=")[0], text.partition("=")[2],
                                  f"value nested too deep (at most {MAX_DEPTH} levels)"))
        return None
    if ov.is_sweep_override():
        errors.append(ConfigError(ov.key_or_group, text.partition("=")[2], "sweeps are not supported here",
                                  "run one command per value"))
        return None
    try:
        value = ov.value()
    except (ValueError, RecursionError) as exc:
        errors.append(ConfigError(ov.key_or_group, text.partition("=")[2], "cannot read the value", str(exc)[:200]))
        return None
    if nesting_depth(value) > MAX_DEPTH:
        errors.append(ConfigError(ov.key_or_group, value, f"value nested too deep (at most {MAX_DEPTH} levels)"))
        return None
    return ov


def _bare_word_example(word: str) -> str:
    """How the word would be written as an override, when it names a group or a key."""
    if word in GROUPS:
        members = group_members(word)
        default = getattr(getattr(SlimeConfig(), word), "name", None)
        example = default if default in members else members[0] if members else "NAME"
        return f"e.g. {word}={example} (members: {', '.join(members)})"
    if word in schema_paths(SlimeConfig):
        return f"e.g. {word}=VALUE"
    return "e.g. trainer=torch, trainer.max_steps=20 or +recipe=opd"


def _parse(overrides: list[str], recipe_dirs: tuple[str, ...], errors: list[ConfigError]) -> _Parsed:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    parsed = _Parsed({}, None, [])
    for text in overrides:
        ov = _parse_one(parser, text, errors)
        if ov is None:
            continue
        key = ov.key_or_group
        if ov.is_delete():
            errors.append(ConfigError(key, text, "deleting keys is not supported", "set the key to a value or null"))
        elif key == "recipe":
            spec = str(ov.value())
            recipe = recipe_lib.resolve(spec, recipe_dirs)
            if recipe is None and recipe_lib.looks_like_path(spec):
                errors.append(ConfigError("recipe", spec, f"recipe file {spec} does not exist",
                                          "give the path of a recipe YAML file, or a recipe name "
                                          "(slimecli recipes list)"))
            elif recipe is None:
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


def _hydra_compose(groups: dict[str, str], recipe: recipe_lib.Recipe | None, recipe_text: str,
                   errors: list[ConfigError]) -> dict[str, Any]:
    """Hydra's composition of the primary config, the group choices and the recipe (already checked).

    Whatever Hydra or OmegaConf still refuse (an interpolation that cannot be resolved, an unset
    ${oc.env:...}) becomes a config error naming the key and the file; the result is then the primary
    config alone, so the other checks can still run.
    """
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    overrides = [f"{g}={m}" for g, m in groups.items()]
    tmp = None
    try:
        if recipe is not None:
            tmp = Path(tempfile.mkdtemp(prefix="slimecli-recipe-"))
            (tmp / "recipe").mkdir()
            (tmp / "recipe" / "recipe.yaml").write_text(recipe_text, encoding="utf-8")
            overrides += [f"hydra.searchpath=[file://{tmp}]", "+recipe=recipe"]
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None, job_name="slimecli"):
            cfg = compose(config_name="config", overrides=overrides)
        data = OmegaConf.to_container(cfg, resolve=True)
    except Exception as exc:  # Hydra and OmegaConf raise many kinds; each is a config error
        if recipe is None:
            raise
        errors.append(_composition_error(exc, recipe))
        return _hydra_compose(groups, None, "", errors)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    assert isinstance(data, dict)
    data.pop("hydra", None)
    if recipe is not None:
        data["recipe"] = recipe.name
    return cast(dict[str, Any], data)


def _composition_error(exc: Exception, recipe: recipe_lib.Recipe) -> ConfigError:
    key = getattr(exc, "full_key", None)
    message = (str(getattr(exc, "msg", "") or exc).strip().splitlines() or [type(exc).__name__])[0]
    message = message.replace("recipe/recipe", f"recipe/{recipe.name}")
    if key:
        return ConfigError(str(key), None, f"cannot resolve: {message}", f"in recipe {recipe.path}")
    return ConfigError(f"recipe {recipe.path}", recipe.name, f"cannot compose: {message}")


def _resolve_interpolations(data: dict[str, Any], before: dict[str, Any], paths: list[str],
                            errors: list[ConfigError]) -> None:
    """Override values like `run.name=${oc.env:USER}-x` are resolved against the composed config, as Hydra would.

    A value that cannot be resolved is reported once and the key keeps its value from ``before`` (so
    the schema check does not report it again as a string of the wrong type).
    """
    from omegaconf import OmegaConf

    try:
        conf = OmegaConf.create(data)
    except Exception:  # noqa: BLE001 - a value OmegaConf cannot hold was already reported by set_path or build
        return
    for path in paths:
        try:
            node = OmegaConf.select(conf, path, throw_on_missing=True)
            value = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
        except Exception as exc:  # noqa: BLE001 - every OmegaConf resolution error is the user's value
            message = "it refers to itself" if isinstance(exc, RecursionError) else (
                str(getattr(exc, "msg", "") or exc).strip().splitlines() or [type(exc).__name__])[0]
            errors.append(ConfigError(path, get(data, path), f"cannot resolve the interpolation: {message}"))
            try:
                value = get(before, path)
            except (KeyError, TypeError):  # an added key: drop it
                drop(data, path)
                continue
        put(data, path, value)


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
    env = data.get("env", {}).get("name")
    if env not in (None, "none") and "reward" not in parsed.groups and reward != "env":
        implied["reward"] = "env"  # the environment's reward is the reward (a reward= given with env is refused)
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
    recipe_text = ""
    if parsed.recipe is not None:
        recipe_text, recipe_errors = recipe_lib.check(parsed.recipe)
        if recipe_errors:
            errors.extend(recipe_errors)
            parsed.recipe = None
    compose_errors: list[ConfigError] = []
    data = _hydra_compose(parsed.groups, parsed.recipe, recipe_text, compose_errors)
    implied = _implied_groups(data, parsed, env_agent, uses_agent)
    if implied:
        compose_errors.clear()
        data = _hydra_compose({**parsed.groups, **implied}, parsed.recipe, recipe_text, compose_errors)
    errors.extend(compose_errors)
    interpolated = []
    before = copy.deepcopy(data)
    for path, value in parsed.values:
        if set_path(data, path, value, errors) and has_interpolation(value):
            interpolated.append(path)
    if interpolated:
        _resolve_interpolations(data, before, interpolated, errors)
    _apply_aliases(data, parsed, errors)
    _imply_env_rollout(data, {path for path, _ in parsed.values})
    return data, errors


def _imply_env_rollout(data: dict[str, Any], given: set[str]) -> None:
    """With an environment, its episodes are the rollout: rollout.generate=env unless another kind was named
    (which the env rules refuse, with the reason). The quickstart's held-out set gives way too, unless the command
    line asks for it: it grades quickstart prompts, nothing of the environment's."""
    env, rollout, ev = data.get("env"), data.get("rollout"), data.get("eval")
    if not isinstance(env, dict) or env.get("name") in (None, "none"):
        return
    if isinstance(rollout, dict) and rollout.get("generate", "single_turn") == "single_turn":
        rollout["generate"] = "env"
    if isinstance(ev, dict) and "eval.datasets" not in given and isinstance(ev.get("datasets"), list):
        kept = [ds for ds in ev["datasets"] if not (isinstance(ds, dict) and ds.get("task") == "quickstart"
                                                    and not ds.get("env"))]
        if len(kept) < len(ev["datasets"]):
            ev["datasets"] = kept
            if not kept:  # nothing left to evaluate at the start or the end
                for key in ("at_start", "at_end"):
                    if f"eval.{key}" not in given:
                        ev[key] = False


# Another tool's word for a key, accepted as that key: a SLURM user writes --nodes, torchrun --nnodes.
KEY_ALIASES = {"cluster.nodes": "cluster.nnodes"}


def _apply_aliases(data: dict[str, Any], parsed: _Parsed, errors: list[ConfigError]) -> None:
    """Move an alias's value (command line or recipe) onto its key; the command line wins over a recipe, and
    the alias and its key set to different values on the command line is an error naming both."""
    given = dict(parsed.values)
    for alias, target in KEY_ALIASES.items():
        parent, _, leaf = alias.rpartition(".")
        try:
            node = get(data, parent)
        except (KeyError, TypeError):
            continue
        if not isinstance(node, dict) or leaf not in node:
            continue
        value = node.pop(leaf)
        if target in given and alias in given and given[target] != value:
            errors.append(ConfigError(alias, value, f"is another name for {target}, which is set to "
                                      f"{given[target]!r} on the same command line", f"set only {target}"))
        elif target not in given or alias in given:
            put(data, target, value)


def _with_leaf_hint(error: ConfigError) -> ConfigError:
    """An unknown key whose last part is a key elsewhere (`max_steps` for trainer.max_steps, `trainer.lr` for
    optimizer.lr) points there; otherwise it keeps its hint, or gets the closest key by last part."""
    if error.reason != "unknown key":
        return error
    import difflib

    where, _, leaf = error.path.rpartition(".")
    paths = [p for p in schema_paths(SlimeConfig) if p != error.path]
    exact = [p for p in paths if p.rsplit(".", 1)[-1] == leaf]
    if len(exact) > 1 and where:  # `rollot.temperature`: the one under the group closest to what was typed
        near = difflib.get_close_matches(where, [p.rpartition(".")[0] for p in exact], n=1, cutoff=0.6)
        exact = [p for p in exact if near and p.rpartition(".")[0] == near[0]] or exact
    if exact:
        hint = f"did you mean '{exact[0]}'?" if len(exact) == 1 else \
            f"did you mean one of {', '.join(repr(p) for p in exact[:6])}?"
    elif error.hint:
        return error
    else:
        by_leaf = {p.rsplit(".", 1)[-1]: p for p in reversed(paths)}  # the first path of each last part
        close = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.75) if len(leaf) < 200 else []
        hint = f"did you mean '{by_leaf[close[0]]}'?" if close else ""
    return replace(error, hint=hint)


def load(overrides: Sequence[str] = (), recipe_dirs: tuple[str, ...] = (), uses_agent: bool = False,
         checks: Callable[[SlimeConfig], list[ConfigError]] | None = None,
         composer: Composer | None = None) -> SlimeConfig:
    """Compose, check the schema and every rule (and `checks`: a command's checks of the files the config names,
    reported with the rest); raise ConfigErrors with all of them at once. ``composer``: what composes the plain
    config instead of compose_dict (a resume: the run's stored config with the overrides on top, config/resume.py)."""
    from slimecli.config.convert import build
    from slimecli.config.rules import check_all

    data, errors = (composer or compose_dict)(list(overrides), tuple(recipe_dirs), uses_agent)
    rewrites = canonicalize(data)
    cfg = build(SlimeConfig, data, "", errors)
    errors = [_with_leaf_hint(e) for e in errors]
    if cfg is not None:
        errors.extend(check_all(cfg))
        if checks is not None:
            errors.extend(checks(cfg))
    errors = as_written(errors, rewrites)
    announce(rewrites)
    if errors or cfg is None:
        raise ConfigErrors(errors)
    return cfg
