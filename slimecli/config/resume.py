"""A resumed run's config: the run's stored config, with only what the command line says changed on top.

`slimecli train run.dir=RUN` on a run that exists resumes it with RUN's own settings (its optimizer, LoRA rank,
run.name, recipe), not the defaults'. The command line is then compared with the stored config, key by key:
- `key=value` sets that key;
- `group=member` replaces the group with that member (as composed from the defaults and the run's recipe), unless
  the run already has that member: then it changes nothing;
- `+recipe=NAME` of the run's own recipe changes nothing; another recipe composes the whole config afresh;
- SWE_AGENT, for a run that uses an agent, is `agent=...` given by the environment.
What a command says about itself (run.resume, observe.verbose) and where servers listen (ports: picked afresh by
each start) come from the command line and the defaults, never from the stored config.
"""

from __future__ import annotations

import copy
from typing import Any

from slimecli.config import compose as c
from slimecli.config import recipes as recipe_lib
from slimecli.config.convert import schema_paths, to_plain
from slimecli.config.errors import ConfigError
from slimecli.config.port import is_port_key
from slimecli.config.schema import SlimeConfig
from slimecli.config.tree import get, has_interpolation, put, set_path

# Keys that describe the command, not the run: each command gives its own (or the default).
PER_COMMAND = ("run.resume", "observe.verbose")


def override_value(overrides: list[str], key: str) -> str | None:
    """The value the last override of ``key`` gives (quotes removed), as a string; None when none gives it or
    it cannot be parsed (composition reports that)."""
    for text in reversed(overrides):
        if text.partition("=")[0].lstrip("+~") != key:
            continue
        from hydra.core.override_parser.overrides_parser import OverridesParser  # only then: Hydra is slow to import

        try:
            (ov,) = OverridesParser.create().parse_overrides([text])
            value = ov.value()
        except Exception:  # noqa: BLE001 - a malformed override is composition's error to report
            return None
        return None if value is None else str(value)
    return None


def compose_onto(stored: dict[str, Any], overrides: list[str], recipe_dirs: tuple[str, ...] = (),
                 uses_agent: bool = False) -> tuple[dict[str, Any], list[ConfigError]]:
    """The plain config a resume runs with: ``stored`` (RUN/config.yaml as plain data) with the command line's
    overrides on top, and the errors found (not yet schema-checked)."""
    errors: list[ConfigError] = []
    parsed = c._parse(list(overrides), recipe_dirs, errors)
    env_agent = c._env_agent(errors)
    stored_recipe = stored.get("recipe")
    if parsed.recipe is not None and parsed.recipe.name != stored_recipe:  # another recipe: another composition
        data, more = c.compose_dict(list(overrides), recipe_dirs, uses_agent)
        return data, errors + [e for e in more if e not in errors]
    recipe = parsed.recipe
    if recipe is None and isinstance(stored_recipe, str):
        recipe = recipe_lib.resolve(stored_recipe, recipe_dirs)  # the run's own, to compose a changed group with
    data = copy.deepcopy(stored)
    _change_groups(data, parsed, env_agent, uses_agent, recipe, errors)
    given = {path for path, _ in parsed.values}
    before = copy.deepcopy(data)
    interpolated = []
    for path, value in parsed.values:
        if set_path(data, path, value, errors) and has_interpolation(value):
            interpolated.append(path)
    if interpolated:
        c._resolve_interpolations(data, before, interpolated, errors)
    c._apply_aliases(data, parsed, errors)
    c._imply_env_rollout(data, given)
    _reset_per_command(data, given)
    return data, errors


def _change_groups(data: dict[str, Any], parsed: c._Parsed, env_agent: str | None, uses_agent: bool,
                   recipe: recipe_lib.Recipe | None, errors: list[ConfigError]) -> None:
    """Replace each group the command line (or SWE_AGENT, or a group that follows from them) picks another member
    of with that member as composed afresh."""
    wanted = dict(parsed.groups)
    implied = c._implied_groups(data, parsed, env_agent, uses_agent)
    if "agent" in implied:
        wanted["agent"] = implied["agent"]
    changed = {g: m for g, m in wanted.items() if _member(data, g) != m}
    if not changed:
        return
    recipe_text = ""
    if recipe is not None:
        recipe_text, recipe_errors = recipe_lib.check(recipe)
        if recipe_errors:  # reported, as a fresh compose reports them; the groups are composed without it
            errors.extend(recipe_errors)
            recipe = None
    fresh = c._hydra_compose(changed, recipe, recipe_text, errors)
    follows = {g: m for g, m in c._implied_groups(fresh, parsed, env_agent, uses_agent).items()
               if g not in wanted and _member(data, g) != m}  # task=swe: reward=swe_tests
    if follows:
        changed.update(follows)
        fresh = c._hydra_compose(changed, recipe, recipe_text, errors)
    for group in changed:
        if group in fresh:
            data[group] = fresh[group]


def _member(data: dict[str, Any], group: str) -> Any:
    node = data.get(group)
    return node.get("name") if isinstance(node, dict) else None


def _reset_per_command(data: dict[str, Any], given: set[str]) -> None:
    """The command's own keys and the ports: the schema's defaults unless the command line gives them."""
    defaults = to_plain(SlimeConfig())
    for path in [*PER_COMMAND, *(p for p in schema_paths(SlimeConfig) if is_port_key(p))]:
        if path in given:
            continue
        try:
            value = get(defaults, path)
            get(data, path.rpartition(".")[0])
        except (KeyError, TypeError):
            continue
        put(data, path, value)
    if "teachers" not in given and isinstance(data.get("teachers"), list):  # each listed teacher's port too
        for entry in data["teachers"]:
            if isinstance(entry, dict) and "port" in entry:
                entry["port"] = defaults["teacher"]["port"]
