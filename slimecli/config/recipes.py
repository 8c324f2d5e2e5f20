"""Recipes: `# @package _global_` files of the `recipe` group, shipped or the user's own."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from slimecli.config.paths import recipes_dir

RECIPE_PATH_ENV = "SLIMECLI_RECIPE_PATH"  # extra recipe directories, separated by ':'


@dataclass(frozen=True)
class Recipe:
    name: str
    path: Path

    @property
    def description(self) -> str:
        """The first comment line that is not the package directive."""
        for line in self.path.read_text().splitlines():
            text = line.strip()
            if text.startswith("#") and "@package" not in text:
                return text.lstrip("#").strip()
            if text and not text.startswith("#"):
                break
        return ""


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


def resolve(spec: str, extra: list[str] | tuple[str, ...] = ()) -> Recipe | None:
    """A recipe by name, or by a path to a YAML file."""
    if spec.endswith((".yaml", ".yml")) or os.sep in spec:
        p = Path(spec).expanduser()
        return Recipe(p.stem, p.resolve()) if p.is_file() else None
    return available(extra).get(spec)
