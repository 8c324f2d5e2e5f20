"""Turn a plain (composed) dict into the frozen dataclass tree (through the one decoder), collecting every error.

Also the reverse: a frozen config back to plain data for YAML.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, TypeVar

from slimecli.config.decode import CONFIG, decode, field_specs, field_types
from slimecli.config.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")
MAX_DEPTH = 32  # how deep a config value may nest (lists and mappings inside each other)


def nesting_depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """How deep lists/tuples/mappings nest in ``value`` (a scalar is 0), counting no further than ``limit + 1``.

    Iterative, so a value nested thousands deep cannot exhaust the stack.
    """
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = list(node.values())
        elif isinstance(node, (list, tuple)):
            children = list(node)
        else:
            continue
        deepest = max(deepest, depth + 1)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def build(cls: type[T], data: dict[str, Any], prefix: str, errors: list[ConfigError]) -> T | None:
    """Build `cls` from `data`; unknown keys and bad values go to `errors` (None: it could not be built)."""
    return decode(cls, data, prefix, errors, CONFIG)


def to_plain(obj: Any) -> Any:
    """Frozen config -> plain lists/dicts for YAML and JSON."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj


def schema_paths(cls: type, prefix: str = "") -> list[str]:
    """Every leaf key path of the schema (for did-you-mean over full paths)."""
    out: list[str] = []
    for name, tp in field_types(cls).items():
        path = f"{prefix}.{name}" if prefix else name
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out.extend(schema_paths(tp, path))
        else:
            out.append(path)
    return out


def is_resumable(cls: type, key: str) -> bool:
    """Whether the dotted key may change when a run resumes: its field's spec, or a group's above it, says so."""
    for name in key.split("."):
        if not (dataclasses.is_dataclass(cls) and name in field_types(cls)):
            return False
        if field_specs(cls)[name].resumable:
            return True
        cls = field_types(cls)[name]
    return False
