"""Recipes: `# @package _global_` files of the `recipe` group, shipped or the user's own.

A recipe is read and checked here before Hydra sees it, so that a file that is not a recipe (any YAML,
`/etc/passwd`, binary bytes), one Hydra cannot parse, or one with a bad `defaults` entry is a config
error naming the file and the line, never a traceback and never silently ignored.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slimecli.config.errors import ConfigError, allowed_hint, did_you_mean
from slimecli.config.paths import recipes_dir

RECIPE_PATH_ENV = "SLIMECLI_RECIPE_PATH"  # extra recipe directories, separated by ':'
PACKAGE_GLOBAL = "# @package _global_"
MAX_RECIPE_BYTES = 1 << 20


@dataclass(frozen=True)
class Recipe:
    name: str
    path: Path

    @property
    def description(self) -> str:
        """The first paragraph of the leading comment (the package directive left out), its lines joined: it ends at
        an empty comment line or where the comment does."""
        try:
            text = self.path.read_bytes()[:MAX_RECIPE_BYTES].decode("utf-8", "replace")
        except OSError:
            return ""
        words: list[str] = []
        for line in text.splitlines():
            stripped = line.strip()
            if not stripped.startswith("#"):
                if stripped or words:
                    break
                continue
            body = stripped.lstrip("#").strip()
            if body.startswith("@package"):
                continue
            if not body:
                if words:
                    break
                continue
            words.append(body)
        return " ".join(words)


def search_dirs(extra: list[str] | tuple[str, ...] = ()) -> list[Path]:
    """User directories first (they may shadow a shipped recipe), then the shipped ones."""
    env = [p for p in os.environ.get(RECIPE_PATH_ENV, "").split(os.pathsep) if p]
    return [Path(d).expanduser() for d in (*extra, *env)] + [recipes_dir()]


def available(extra: list[str] | tuple[str, ...] = ()) -> dict[str, Recipe]:
    found: dict[str, Recipe] = {}
    for d in search_dirs(extra):
        for p in sorted(d.glob("*.yaml")) if d.is_dir() else []:
            found.setdefault(p.stem, Recipe(p.stem, p))
    return found


def looks_like_path(spec: str) -> bool:
    """`+recipe=./mine.yaml` names a file; `+recipe=opd` a recipe found by name."""
    return spec.endswith((".yaml", ".yml")) or os.sep in spec or "/" in spec


def resolve(spec: str, extra: list[str] | tuple[str, ...] = ()) -> Recipe | None:
    """A recipe by name, or by a path to a YAML file."""
    if looks_like_path(spec):
        try:
            p = Path(spec).expanduser()
            return Recipe(p.stem, p.resolve()) if p.is_file() else None
        except (OSError, RuntimeError, ValueError):  # ~nosuchuser, a name too long, a NUL byte
            return None
    return available(extra).get(spec)


def _package(text: str) -> str | None:
    """The `# @package X` directive of the file's leading comment block, if any."""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("#"):
            return None
        body = stripped.lstrip("#").strip()
        if body.startswith("@package"):
            return body[len("@package"):].strip()
    return None


def _yaml_problem(exc: Exception) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"not valid YAML{where}: {problem}"


def _check_defaults(defaults: Any, where: str) -> list[ConfigError]:
    from slimecli.config.paths import group_members
    from slimecli.config.schema import GROUPS

    hint = "each entry is `- override /GROUP: MEMBER` (or `- _self_`)"
    if not isinstance(defaults, list):
        return [ConfigError(f"{where}: defaults", defaults, "must be a list", hint)]
    errors = []
    for i, entry in enumerate(defaults):
        key = f"{where}: defaults[{i}]"
        if entry == "_self_":
            continue
        if not (isinstance(entry, dict) and len(entry) == 1 and isinstance(next(iter(entry)), str)):
            errors.append(ConfigError(key, entry, "not a defaults entry", hint))
            continue
        ((raw, member),) = entry.items()
        words = raw.split()
        group = words[-1].lstrip("/") if words and set(words[:-1]) <= {"override", "optional"} else ""
        if group not in GROUPS:
            errors.append(ConfigError(key, raw, "unknown config group", allowed_hint(group, GROUPS, "/")))
        elif not isinstance(member, str) or member not in group_members(group):
            errors.append(ConfigError(key, member, f"unknown {group} option",
                                      allowed_hint(str(member), group_members(group))))
        elif "override" not in words:
            errors.append(ConfigError(key, raw, "the primary config already picks this group",
                                      f"write `- override /{group}: {member}`"))
    return errors


def check(recipe: Recipe) -> tuple[str, list[ConfigError]]:
    """The recipe's text as Hydra should read it (always `# @package _global_`), and its problems.

    A file is a recipe when it says `# @package _global_`, or when every top-level key is a config
    section (then the directive is implied); anything else is refused.
    """
    import yaml

    from slimecli.config.convert import MAX_DEPTH, nesting_depth
    from slimecli.config.schema import SlimeConfig

    where = f"recipe {recipe.path}"
    try:
        with open(recipe.path, "rb") as f:
            raw = f.read(MAX_RECIPE_BYTES + 1)
    except OSError as exc:
        return "", [ConfigError(where, str(recipe.path), f"cannot read the recipe: {exc.strerror or exc}")]
    if len(raw) > MAX_RECIPE_BYTES:
        return "", [ConfigError(where, f"{len(raw)}+ bytes", f"too large for a recipe (at most {MAX_RECIPE_BYTES} bytes)")]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return "", [ConfigError(where, raw[exc.start:exc.start + 8], f"not UTF-8 text (byte {exc.start})",
                                "a recipe is a YAML text file")]
    if "\x00" in text:
        return "", [ConfigError(where, "\\x00", "binary data (a NUL byte)", "a recipe is a YAML text file")]
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        hint = "YAML indents with spaces, not tabs" if "\t" in text else ""
        return "", [ConfigError(where, recipe.path.name, _yaml_problem(exc), hint)]
    except (ValueError, RecursionError) as exc:  # e.g. an integer with thousands of digits, or deep nesting
        return "", [ConfigError(where, recipe.path.name, f"cannot read the YAML: {str(exc).splitlines()[0]}")]
    package = _package(text)
    known = [name for name in SlimeConfig.__dataclass_fields__ if name != "recipe"]
    if data is None:
        data = {}
    not_recipe = "not a recipe: a recipe file starts with `# @package _global_` and sets config sections"
    if not isinstance(data, dict):
        return "", [ConfigError(where, type(data).__name__, not_recipe + " (this file is not a YAML mapping)")]
    if package not in (None, "_global_"):
        return "", [ConfigError(where, f"@package {package}", "recipes are `# @package _global_` files")]
    unknown = [k for k in data if k != "defaults" and k not in known]
    if package is None and (unknown or not data):
        return "", [ConfigError(where, recipe.path.name, not_recipe,
                                f"top-level keys must be among: defaults, {', '.join(known)}")]
    errors = [ConfigError(f"{where}: {k}", data[k], "unknown config section", did_you_mean(str(k), known))
              for k in unknown]
    if nesting_depth(data, MAX_DEPTH + 2) > MAX_DEPTH + 2:  # the file and its sections are two levels
        errors.append(ConfigError(where, recipe.path.name, f"values nest deeper than {MAX_DEPTH} levels"))
    if "defaults" in data:
        errors += _check_defaults(data["defaults"], where)
    return (text if package else f"{PACKAGE_GLOBAL}\n{text}"), errors
