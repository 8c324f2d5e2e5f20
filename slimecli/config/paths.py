"""Where the shipped config tree lives: inside the wheel, or at the top of a source checkout."""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent.parent


def _pick(packaged: str, source: str) -> Path:
    inside = _PKG / packaged
    return inside if inside.is_dir() else _PKG.parent / source


def conf_dir() -> Path:
    return _pick("_conf", "conf")


def recipes_dir() -> Path:
    return _pick("_recipes", "recipes")


def group_members(group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))
