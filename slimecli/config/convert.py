"""Turn a plain (composed) dict into the frozen dataclass tree, collecting every error.

Also the reverse: a frozen config back to plain data for YAML.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from functools import cache
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union

from slimecli.config.errors import ConfigError, allowed_hint, did_you_mean

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_MISSING = object()
T = TypeVar("T", bound="DataclassInstance")

# A float field accepts inf/-inf only when its dataclass field says so: field(metadata={NON_FINITE: True}).
# NaN is refused everywhere. Ints must fit in 64 bits (they end in C code: torch, ports, sizes).
NON_FINITE = "non_finite"
# A field whose type error should say what it accepts in words (a union reads badly: "int | 'auto'") sets
# field(metadata={ALLOWED: "auto or a TCP port 1..65535"}).
ALLOWED = "allowed"
INT_BOUND = 2**63
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


@cache
def field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(tp))
        return f"{origin.__name__}[{args}]"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, path: str, errors: list[ConfigError], non_finite: bool = False) -> Any:
    """Check `value` against `tp`; return the converted value or _MISSING after recording an error.

    ``non_finite``: the field accepts inf/-inf (NaN never).
    """
    origin = typing.get_origin(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            errors.append(ConfigError(path, value, f"expected a mapping of {tp.__name__} fields"))
            return _MISSING
        return build(tp, value, path, errors)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            errors.append(ConfigError(path, value, f"must not be null; expected {_type_name(tp)}"))
            return _MISSING
        trial: list[ConfigError] = []
        for arg in args:
            if arg is type(None):
                continue
            trial.clear()
            out = _convert(value, arg, path, trial, non_finite)
            if not trial:
                return out
        errors.extend(trial if len([a for a in args if a is not type(None)]) == 1 else
                      [ConfigError(path, value, f"expected {_type_name(tp)}")])
        return _MISSING
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value in allowed and type(value) is type(allowed[0]):
            return value
        errors.append(ConfigError(path, value, "not an allowed value", allowed_hint(str(value), [str(a) for a in allowed])))
        return _MISSING
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            errors.append(ConfigError(path, value, f"expected a list {_type_name(tp)}"))
            return _MISSING
        if len(args) == 2 and args[1] is Ellipsis:
            args = (args[0],) * len(value)
        if len(value) != len(args):
            errors.append(ConfigError(path, value, f"expected {len(args)} items ({_type_name(tp)})"))
            return _MISSING
        items = [_convert(v, a, f"{path}[{i}]", errors, non_finite)
                 for i, (v, a) in enumerate(zip(value, args, strict=True))]
        return _MISSING if any(i is _MISSING for i in items) else tuple(items)
    if origin is list:
        (arg,) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            errors.append(ConfigError(path, value, f"expected a list {_type_name(tp)}"))
            return _MISSING
        items = [_convert(v, arg, f"{path}[{i}]", errors, non_finite) for i, v in enumerate(value)]
        return _MISSING if any(i is _MISSING for i in items) else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            errors.append(ConfigError(path, value, "expected a mapping"))
            return _MISSING
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        errors.append(ConfigError(path, value, "expected bool (true/false)"))
        return _MISSING
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if not -INT_BOUND <= value < INT_BOUND:
                errors.append(ConfigError(path, value, "integer out of range (it must fit in 64 bits)"))
                return _MISSING
            return value
        errors.append(ConfigError(path, value, "expected int"))
        return _MISSING
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return _finite_float(value, path, errors, non_finite)
        errors.append(ConfigError(path, value, "expected float"))
        return _MISSING
    if tp is str:
        if isinstance(value, str):
            return value
        errors.append(ConfigError(path, value, "expected str"))
        return _MISSING
    raise TypeError(f"unsupported schema type {tp!r} at {path}")


def _finite_float(value: int | float, path: str, errors: list[ConfigError], non_finite: bool) -> Any:
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        errors.append(ConfigError(path, value, "number out of range"))
        return _MISSING
    if math.isnan(number):
        errors.append(ConfigError(path, value, "expected a number, not NaN"))
        return _MISSING
    if math.isinf(number) and not non_finite:
        errors.append(ConfigError(path, value, "must be a finite number",
                                  "a literal like 1e999 overflows to infinity; use a value in the float range"))
        return _MISSING
    return number


def build(cls: type[T], data: dict[str, Any], prefix: str, errors: list[ConfigError]) -> T | None:
    """Build `cls` from `data`; unknown keys and bad values go to `errors` (None: it could not be built)."""
    hints = field_types(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    names = list(fields)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in hints:
            errors.append(ConfigError(path, value, "unknown key",
                                      did_you_mean(str(key), names, f"{prefix}." if prefix else "")))
            continue
        found = len(errors)
        out = _convert(value, hints[key], path, errors, bool(fields[key].metadata.get(NON_FINITE)))
        allowed = fields[key].metadata.get(ALLOWED)
        if out is _MISSING and allowed:
            del errors[found:]
            close = did_you_mean(value, _literal_words(hints[key])) if isinstance(value, str) else ""
            errors.append(ConfigError(path, value, f"expected {allowed}", close))
        if out is not _MISSING:
            kwargs[key] = out
    try:
        return cls(**kwargs)
    except TypeError:  # a required field is missing; already reported through errors
        return None


def _literal_words(tp: Any) -> list[str]:
    """The words a type accepts literally (its Literal members, also inside a union): for did-you-mean."""
    if typing.get_origin(tp) is Literal:
        return [str(a) for a in typing.get_args(tp)]
    if typing.get_origin(tp) in (Union, types.UnionType):
        return [word for arg in typing.get_args(tp) for word in _literal_words(arg)]
    return []


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
