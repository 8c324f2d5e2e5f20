"""Paths in a plain config dict (`trainer.lora.rank`): read, set, drop, and set from the command line, where a key
the schema does not know is an error naming the closest one."""

from __future__ import annotations

import dataclasses
from typing import Any

from slimecli.config.convert import schema_paths
from slimecli.config.errors import ConfigError, did_you_mean
from slimecli.config.schema import SlimeConfig


def get(data: dict[str, Any], path: str) -> Any:
    node: Any = data
    for part in path.split("."):
        node = node[part]
    return node


def drop(data: dict[str, Any], path: str) -> None:
    *parents, last = path.split(".")
    node: Any = data
    for part in parents:
        node = node[part]
    node.pop(last, None)


def put(data: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node: Any = data
    for part in parents:
        node = node[part]
    node[last] = value


def has_interpolation(value: Any) -> bool:
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, dict):
        return any(has_interpolation(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(has_interpolation(v) for v in value)
    return False


def set_path(data: dict[str, Any], path: str, value: Any, errors: list[ConfigError]) -> bool:
    node: Any = data
    parts = path.split(".")
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, dict) and part not in node and (is_section(".".join(parts[:i + 1]))
                                                            or is_free_mapping(".".join(parts[:i + 1]))):
            node[part] = {}  # a nested section (trainer.lora) no YAML file mentions: its defaults are the schema's
        if not isinstance(node, dict) or part not in node:
            where = ".".join(parts[:i])
            keys = list(node) if isinstance(node, dict) else []
            errors.append(ConfigError(path, value, "unknown key",
                                      did_you_mean(part, keys, f"{where}." if where else "")))
            return False
        node = node[part]
    if not isinstance(node, dict):
        errors.append(ConfigError(path, value, "cannot set a key inside a non-mapping value"))
        return False
    node[parts[-1]] = value
    return True


def is_free_mapping(path: str) -> bool:
    """A dict-valued field of the schema (env.args): any key may be set below it."""
    import typing

    from slimecli.config.decode import field_types

    cls: Any = SlimeConfig
    for name in path.split("."):
        hints = field_types(cls) if isinstance(cls, type) and dataclasses.is_dataclass(cls) else {}
        if name not in hints:
            return False
        cls = hints[name]
    return typing.get_origin(cls) is dict


def is_section(path: str) -> bool:
    """A nested dataclass of the schema (its keys are paths below it)."""
    return any(p.startswith(f"{path}.") for p in schema_paths(SlimeConfig))
