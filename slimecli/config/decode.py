"""One decoder for typed plain data: the config groups and every server's request bodies.

A dataclass says what a mapping may hold; `decode` checks a plain value (composed YAML, parsed JSON) against
it and collects every problem as a FieldError that names its path, the bad value, what is allowed and a
did-you-mean. A field's `spec(...)` says what its type cannot: bounds, the words a type error uses, whether
inf is allowed, whether it may change when a run resumes. The config and the servers differ only in their
Mode: a request's JSON null means "not given", and a request bounds its own integers.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import TYPE_CHECKING, Any, Literal, TypeGuard, TypeVar, Union

from slimecli.config.errors import NO_VALUE, FieldError, allowed_hint, did_you_mean, short_repr

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")
MISSING: Any = type("Missing", (), {"__repr__": lambda self: "MISSING"})()  # a value that failed to decode
INT_BOUND = 2**63
show = short_repr  # a value in a message: shortened, never raises


def is_int(value: object) -> TypeGuard[int]:
    """An int that is not a bool (JSON's true is not 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def finite(value: object) -> float | None:
    """The value as a finite float, or None (not a number, a bool, NaN, inf, an int too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


Bound = int | float | str  # a str names a value of the decode context ("vocab_size"), known only at run time


@dataclass(frozen=True)
class Spec:
    """What a field's type cannot say. Bounds apply to every number the field holds (items of a list too)."""

    ge: Bound | None = None
    gt: Bound | None = None
    le: Bound | None = None
    lt: Bound | None = None
    also: tuple[Any, ...] = ()  # values allowed outside the bounds (top_k=-1: all)
    note: str = ""  # after the bounds in a message: "must be >= 0 (0 = no limit)"
    allowed: str = ""  # "expected <allowed>" for a type error, "must be <allowed>" for a bound (a union reads badly)
    non_finite: bool = False  # a float may be inf/-inf (NaN never)
    nonempty: bool = False  # strings must not be empty
    one_or_many: bool = False  # a list field takes a single item for a one-item list ("stop": "x")
    resumable: bool = False  # may differ when a run resumes (it changes no checkpoint's meaning)

    @cached_property
    def bounded(self) -> bool:
        return any(b is not None for b in (self.ge, self.gt, self.le, self.lt))

    @cached_property
    def closed(self) -> bool:
        """Bounded on both sides: the bounds, not the 64-bit range, say which ints fit (a seed takes 2**64 - 1)."""
        return (self.ge is not None or self.gt is not None) and (self.le is not None or self.lt is not None)


SPEC = "slimecli.spec"  # the dataclass field metadata key
NO_SPEC = Spec()


def spec(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING, **kw: Any) -> Any:
    """A dataclass field with a Spec: ``top_p: float = spec(1.0, gt=0, le=1)``."""
    return field(default=default, default_factory=default_factory, metadata={SPEC: Spec(**kw)})


def spec_of(f: dataclasses.Field[Any]) -> Spec:
    found = f.metadata.get(SPEC, NO_SPEC)
    assert isinstance(found, Spec)
    return found


@dataclass(frozen=True)
class Mode:
    """How a source of data is read. The config: nulls only where the type allows them, ints in 64 bits (they end
    in C code). A request body: null is "not given" (SGLang's bodies), and ints are bounded by their specs."""

    null_is_unset: bool = False
    int64: bool = True
    context: Mapping[str, int | float] = field(default_factory=dict)


CONFIG = Mode()
REQUEST = Mode(null_is_unset=True, int64=False)


def request(**context: int | float) -> Mode:
    """The mode of a request body whose bounds name run-time values: ``request(vocab_size=151936)``."""
    return Mode(null_is_unset=True, int64=False, context=context)


def message(errors: list[FieldError]) -> str:
    """Every problem on one line, for a 4xx reply: `a.b: must be >= 0 (got -1); c: expected bool (got 'yes')`."""
    return "; ".join(f"{e.line()} ({e.hint})" if e.hint else e.line() for e in errors)


@cache
def field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@cache
def field_specs(cls: type) -> dict[str, Spec]:
    return {f.name: spec_of(f) for f in dataclasses.fields(cls)}


@cache
def required(cls: type) -> tuple[str, ...]:
    """The fields a mapping must give (no default)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.init and f.default is dataclasses.MISSING
                 and f.default_factory is dataclasses.MISSING)


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(tp))
    if origin is not None:
        args = ", ".join(type_name(a) for a in typing.get_args(tp))
        return f"{origin.__name__}[{args}]"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def literal_words(tp: Any) -> list[str]:
    """The words a type accepts literally (its Literal members, also inside a union): for did-you-mean."""
    if typing.get_origin(tp) is Literal:
        return [str(a) for a in typing.get_args(tp)]
    if typing.get_origin(tp) in (Union, types.UnionType):
        return [word for arg in typing.get_args(tp) for word in literal_words(arg)]
    return []


def decode(cls: type[T], data: Mapping[str, Any], prefix: str, errors: list[FieldError],
           mode: Mode = CONFIG) -> T | None:
    """Build `cls` from `data`; unknown keys and bad values go to `errors` (None: it could not be built)."""
    hints = field_types(cls)
    specs = field_specs(cls)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in hints:
            errors.append(FieldError(path, value, "unknown key",
                                     did_you_mean(str(key), list(hints), f"{prefix}." if prefix else "")))
            continue
        if value is None and mode.null_is_unset:
            continue
        out = decode_value(value, hints[key], path, errors, specs[key], mode)
        if out is not MISSING:
            kwargs[key] = out
    missing = [key for key in required(cls) if key not in kwargs]
    for key in missing:
        if data.get(key) is None:  # not given (a bad value was reported above)
            errors.append(FieldError(f"{prefix}.{key}" if prefix else key, NO_VALUE, "is required"))
    return None if missing else cls(**kwargs)


def decode_value(value: Any, tp: Any, path: str, errors: list[FieldError], fs: Spec = NO_SPEC,
                 mode: Mode = CONFIG) -> Any:
    """`value` checked against type `tp` and spec `fs`: the decoded value, or MISSING after recording errors."""
    found = len(errors)
    out = _convert(value, tp, path, errors, fs, mode)
    if out is MISSING and fs.allowed and len(errors) > found:
        if len(errors) == found + 1 and fs.bounded and errors[found].reason == f"must be {bounds_text(fs, mode)}":
            errors[found] = FieldError(path, value, f"must be {fs.allowed}" + (f" ({fs.note})" if fs.note else ""))
            return out
        del errors[found:]
        close = did_you_mean(value, literal_words(tp)) if isinstance(value, str) else ""
        errors.append(FieldError(path, value, f"expected {fs.allowed}", close))
    return out


def _convert(value: Any, tp: Any, path: str, errors: list[FieldError], fs: Spec, mode: Mode) -> Any:
    if tp in _SCALARS:
        return _scalar(value, tp, path, errors, fs, mode)
    origin = typing.get_origin(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            errors.append(FieldError(path, value, f"expected a mapping of {tp.__name__} fields"))
            return MISSING
        built = decode(tp, value, path, errors, mode)
        return MISSING if built is None else built
    if origin in (Union, types.UnionType):
        return _union(value, tp, path, errors, fs, mode)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value in allowed and type(value) is type(allowed[0]):
            return value
        errors.append(FieldError(path, value, "not an allowed value",
                                 allowed_hint(str(value), [str(a) for a in allowed])))
        return MISSING
    if origin in (tuple, list, frozenset):
        return _sequence(value, tp, path, errors, fs, mode)
    if origin is dict:
        if not isinstance(value, dict):
            errors.append(FieldError(path, value, "expected a mapping"))
            return MISSING
        return dict(value)
    if tp is Any:
        return value
    raise TypeError(f"unsupported schema type {tp!r} at {path}")


_SCALARS = frozenset({bool, int, float, str})


def _scalar(value: Any, tp: Any, path: str, errors: list[FieldError], fs: Spec, mode: Mode) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
        errors.append(FieldError(path, value, "expected bool (true/false)"))
        return MISSING
    if tp is int:
        if not is_int(value):
            errors.append(FieldError(path, value, "expected int"))
            return MISSING
        if mode.int64 and not fs.closed and not -INT_BOUND <= value < INT_BOUND:
            errors.append(FieldError(path, value, "integer out of range (it must fit in 64 bits)"))
            return MISSING
        return _bounded(value, path, errors, fs, mode)
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = _float(value, path, errors, fs.non_finite)
            return number if number is MISSING else _bounded(number, path, errors, fs, mode)
        errors.append(FieldError(path, value, "expected float"))
        return MISSING
    if tp is str:
        if not isinstance(value, str):
            errors.append(FieldError(path, value, "expected str"))
            return MISSING
        if fs.nonempty and not value:
            errors.append(FieldError(path, value, "must not be empty"))
            return MISSING
        return value
    raise AssertionError(tp)


def _union(value: Any, tp: Any, path: str, errors: list[FieldError], fs: Spec, mode: Mode) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if value is None:
        if len(args) < len(typing.get_args(tp)):
            return None
        errors.append(FieldError(path, value, f"must not be null; expected {type_name(tp)}"))
        return MISSING
    trial: list[FieldError] = []
    out_of_bounds: list[FieldError] = []  # a member took the value's type but not its value: that is the error
    for arg in args:
        trial.clear()
        out = _convert(value, arg, path, trial, fs, mode)
        if not trial:
            return out
        if fs.bounded and [e.reason for e in trial] == [f"must be {bounds_text(fs, mode)}"]:
            out_of_bounds = list(trial)
    errors.extend(trial if len(args) == 1 else out_of_bounds or [FieldError(path, value, f"expected {type_name(tp)}")])
    return MISSING


def _sequence(value: Any, tp: Any, path: str, errors: list[FieldError], fs: Spec, mode: Mode) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if fs.one_or_many and not isinstance(value, list | tuple):
        value = [value]
    if not isinstance(value, list | tuple):
        what = type_name(tp) if origin is tuple and args[-1] is not Ellipsis else f"of {type_name(args[0])}"
        errors.append(FieldError(path, value, f"expected a list {what}"))
        return MISSING
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        if len(value) != len(args):
            errors.append(FieldError(path, value, f"expected {len(args)} items ({type_name(tp)})"))
            return MISSING
    else:
        if _plain(value, args[0], fs, mode):  # token ids: 100k of them cost a few passes in C, not 100k calls
            rows = [list(v) for v in value] if args[0] is not int else value
            return tuple(rows) if origin is tuple else frozenset(rows) if origin is frozenset else list(rows)
        args = (args[0],) * len(value)
    items = [_convert(v, a, f"{path}[{i}]", errors, fs, mode) for i, (v, a) in enumerate(zip(value, args, strict=True))]
    if any(i is MISSING for i in items):
        return MISSING
    return tuple(items) if origin is tuple else frozenset(items) if origin is frozenset else items


def _plain(values: list[Any] | tuple[Any, ...], item: Any, fs: Spec, mode: Mode) -> bool:
    """Ints, or lists of ints (label rows), every one inside the bounds: checked without a call per item."""
    if item is int:
        return _plain_ints(values, fs, mode)
    if typing.get_origin(item) is list and typing.get_args(item)[0] is int and set(map(type, values)) == {list}:
        return _plain_ints(list(itertools.chain.from_iterable(values)), fs, mode)
    return False


def _plain_ints(values: list[Any] | tuple[Any, ...], fs: Spec, mode: Mode) -> bool:
    """Every item an int inside the bounds (and 64 bits where the mode asks): the common case, checked at C speed."""
    if not values or set(map(type, values)) != {int}:  # map(type): no Python frame per item (bools fail here)
        return not values
    low, high = min(values), max(values)
    if mode.int64 and not fs.closed and not (-INT_BOUND <= low and high < INT_BOUND):
        return False
    if not fs.bounded:
        return True
    if fs.also:  # values outside the bounds may be allowed: item by item
        return False
    ge, gt, le, lt = (_resolve(b, mode) for b in (fs.ge, fs.gt, fs.le, fs.lt))
    return not ((ge is not None and low < ge) or (gt is not None and low <= gt) or (le is not None and high > le)
                or (lt is not None and high >= lt))


def _float(value: int | float, path: str, errors: list[FieldError], non_finite: bool) -> Any:
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        errors.append(FieldError(path, value, "number out of range"))
        return MISSING
    if math.isnan(number):
        errors.append(FieldError(path, value, "expected a number, not NaN"))
        return MISSING
    if math.isinf(number) and not non_finite:
        errors.append(FieldError(path, value, "must be a finite number",
                                 "a literal like 1e999 overflows to infinity; use a value in the float range"))
        return MISSING
    return number


def _bounded(value: int | float, path: str, errors: list[FieldError], fs: Spec, mode: Mode) -> Any:
    if not fs.bounded or value in fs.also:
        return value
    ge, gt, le, lt = (_resolve(b, mode) for b in (fs.ge, fs.gt, fs.le, fs.lt))
    if (ge is not None and value < ge) or (gt is not None and value <= gt) or (le is not None and value > le) \
            or (lt is not None and value >= lt):
        errors.append(FieldError(path, value, f"must be {bounds_text(fs, mode)}"))
        return MISSING
    return value


def _resolve(bound: Bound | None, mode: Mode) -> int | float | None:
    return mode.context[bound] if isinstance(bound, str) else bound


def _number(x: int | float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def bounds_text(fs: Spec, mode: Mode = CONFIG) -> str:
    """What the bounds allow, in words: ">= 0 (0 = no limit)", "in (0, 1]", "-1 or >= 1"."""
    ge, gt, le, lt = (_resolve(b, mode) for b in (fs.ge, fs.gt, fs.le, fs.lt))
    low, high = (ge, "[") if ge is not None else (gt, "("), (le, "]") if le is not None else (lt, ")")
    if low[0] is not None and high[0] is not None:
        text = f"in {low[1]}{_number(low[0])}, {_number(high[0])}{high[1]}"
    elif low[0] is not None:
        text = f"{'>=' if ge is not None else '>'} {_number(low[0])}"
    else:
        assert high[0] is not None
        text = f"{'<=' if le is not None else '<'} {_number(high[0])}"
    if fs.also:
        text = f"{' or '.join(_number(a) for a in fs.also)} or {text}"
    return f"{text} ({fs.note})" if fs.note else text
