"""The one plugin registry: what a config names by a short name (a reward, an advantage estimator, a policy loss,
an agent, a rollout generate kind, a sandbox) -> the object that implements it.

Each package declares its built-ins in its own `plugins.py` as lazy ``package.module:attr`` strings, importing
nothing but this module, so config validation learns every name (`names()`) without importing torch or the
implementations; the first `get()` of a name imports its module. User code registers objects at run time
(`register`; a name bound to another object is refused, the same object again is a no-op: a module imported
twice, or once by name and once as an entry point), and a kind that allows it also takes an import path (``pkg.mod:attr`` or ``/path/file.py:attr``),
loaded by the one loader, `slimecli.config.import_path.load`. The layer test checks that every built-in points
to a module its declaring package may import.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, cast

from slimecli.config.errors import ConfigError, allowed_hint
from slimecli.config.groups.trainer import TrainerConfig
from slimecli.config.import_path import PATH_HINT, is_import_path, load, syntax_error

# The packages whose plugins.py declares built-ins, imported before the first lookup (each imports only this
# module: declaring stays cheap and torch-free). The layer test keeps this list equal to the files.
DECLARED_IN = ("slimecli.reward.plugins", "slimecli.sandbox.plugins", "slimecli.swe.plugins",
               "slimecli.rollout.plugins", "slimecli.agent.plugins", "slimecli.env.plugins", "slimecli.train.plugins")
P = TypeVar("P")  # what a registry holds: the signature of its functions, or the base of its classes
_discovery = threading.RLock()
_discovered = False


def discover() -> None:
    """Import every package's declarations once per process."""
    global _discovered
    with _discovery:
        if not _discovered:
            for module in DECLARED_IN:
                importlib.import_module(module)
            _discovered = True


class UnknownPluginError(KeyError):
    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "unknown name"


class AdvantageFn(Protocol):
    """trainer.advantage_estimator: (train.advantages.AdvantageBatch, cfg) -> advantages [B, T], or (advantages,
    returns). Tensors are Any here: the config layer never imports torch."""

    def __call__(self, batch: Any, cfg: TrainerConfig, /) -> Any: ...


class PolicyLossFn(Protocol):
    """trainer.policy_loss: (log_ratio, advantages, cfg) -> (per-token loss, {metric: per-token values})."""

    def __call__(self, log_ratio: Any, advantages: Any, cfg: TrainerConfig, /) -> tuple[Any, dict[str, Any]]: ...


class OffPolicyFn(Protocol):
    """trainer.off_policy_correction: (old_logp, behaviour_logp, mask, cfg) -> train.off_policy.Correction."""

    def __call__(self, old_logp: Any, behaviour_logp: Any, mask: Any, cfg: TrainerConfig, /) -> Any: ...


RewardFn = Callable[..., Any]  # reward.name: (sample, label, ...) -> a reward (reward/registry.py says which form)
GenerateFactory = Callable[..., Any]  # rollout.generate: a collector factory or driver class (train/coordinator)
EnvFactory = Callable[..., Any]  # env.id: an environment class or factory (env/adapters/native.py)


@dataclass(frozen=True)
class Entry(Generic[P]):
    name: str
    obj: P  # the function or class
    options: dict[str, Any] = field(default_factory=dict)  # e.g. whiten=True for an advantage estimator

    @property
    def fn(self) -> P:
        return self.obj


def qualified_name(obj: Any) -> str:
    """``module:qualname`` of a function or class: the same object, imported twice, has the same one."""
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', type(obj).__qualname__)}"


@dataclass(frozen=True)
class _Lazy:
    target: str  # package.module:attr, imported by the first get()
    options: dict[str, Any]


class Registry(Generic[P]):
    """One kind of plugin: built-ins declared lazily, objects registered at run time, import paths if allowed.

    reserved: names a config may use that are built elsewhere from the config (reward=remote), never registered.
    Deprecated names are rewritten where the config enters (config/canonical.py), so no registry knows them.
    entry_points: a packaging entry-point group whose entries (name = "pkg.module:attr") installed packages
    declare: `pip install` of such a package is enough to name its objects (read at the first lookup).
    """

    def __init__(self, kind: str, config_key: str, *, paths: bool = False, reserved: tuple[str, ...] = (),
                 entry_points: str | None = None):
        self.kind = kind
        self.config_key = config_key
        self.paths = paths
        self.reserved = reserved
        self.entry_points = entry_points
        self._entries: dict[str, Entry[P] | _Lazy] = {}
        self._declared: dict[str, _Lazy] = {}  # the built-ins as declared, for the layer test
        self._origins: dict[str, str] = {}  # name -> the package that declared it by entry point
        self._scanned = False

    # ---- declaring --------------------------------------------------------------------------------------------
    def builtin(self, name: str, target: str, **options: Any) -> None:
        """Declare a built-in from a package's plugins.py: ``target`` is imported by the first get()."""
        self._check_name(name)
        if not is_import_path(target) or not target.startswith("slimecli."):
            raise ValueError(f"{self.kind} {name!r}: a built-in is a 'slimecli.module:attr' string, got {target!r}")
        self._entries[name] = self._declared[name] = _Lazy(target, dict(options))

    def register(self, name: str, obj: P, **options: Any) -> P:
        """Make ``name`` resolve to ``obj``; returns obj, so it can decorate. A name already bound to another
        object is refused (ValueError: two plugins would silently shadow each other; tests swap entries with
        `override`); the same object again (the same module:qualname: a module imported twice, or a built-in or
        entry point whose module registers itself on import) is a no-op."""
        return self._bind(name, obj, options, replace=False)

    def _bind(self, name: str, obj: P, options: dict[str, Any], *, replace: bool) -> P:
        self._check_name(name)
        if not callable(obj):
            raise TypeError(f"{self.kind} {name!r}: {obj!r} is not callable")
        with _discovery:
            bound = self._entries.get(name)
            if bound is not None and not replace:
                target = bound.target if isinstance(bound, _Lazy) else qualified_name(bound.obj)
                if target == qualified_name(obj) and (not options or options == bound.options):
                    if not (isinstance(bound, Entry) and bound.obj is obj):  # re-imported, or the lazy target
                        self._entries[name] = Entry(name, obj, dict(bound.options))
                    return obj
                theirs = f"{target} {bound.options}" if bound.options else target
                ours = f"{qualified_name(obj)} {options}" if options else qualified_name(obj)
                raise ValueError(f"{self.kind} {name!r} is already registered to {theirs}; cannot register "
                                 f"{ours} under the same name (choose another name)")
            self._entries[name] = Entry(name, obj, dict(options))
            self._origins[name] = "registered at run time"
        return obj

    def decorator(self, name: str, **options: Any) -> Callable[[P], P]:
        self._check_name(name)

        def register(obj: P) -> P:
            return self.register(name, obj, **options)
        return register

    def _check_name(self, name: str) -> None:
        if not name or not isinstance(name, str) or is_import_path(name):
            raise ValueError(f"{self.kind} name must be a non-empty string without ':', got {name!r}")
        if name in self.reserved:
            raise ValueError(f"{self.kind} {name!r} is built from the config and cannot be registered")

    # ---- installed packages -----------------------------------------------------------------------------------
    def _scan_entry_points(self) -> None:
        """Names that installed packages declare in the entry-point group, once per process (a built-in or a
        run-time registration of the same name wins)."""
        if self.entry_points is None or self._scanned:
            return
        from importlib.metadata import entry_points

        with _discovery:
            if self._scanned:
                return
            for point in entry_points(group=self.entry_points):
                if point.name in self._entries or not is_import_path(point.value) or is_import_path(point.name):
                    continue
                self._entries[point.name] = _Lazy(point.value, {})
                dist = point.dist
                self._origins[point.name] = f"{dist.name} {dist.version}" if dist is not None else "entry point"
            self._scanned = True

    def origin(self, name: str) -> str:
        """Where a name comes from: slimecli (a built-in), an installed package, or a run-time registration."""
        self.names()
        if name in self._declared:
            return "slimecli"
        return self._origins.get(name, "")

    # ---- looking up -------------------------------------------------------------------------------------------
    def names(self) -> list[str]:
        """Every name a config may give (built-ins first, in declaration order), without importing any of them."""
        discover()
        self._scan_entry_points()
        return list(dict.fromkeys([*self._entries, *self.reserved]))

    def declared(self) -> dict[str, tuple[str, dict[str, Any]]]:
        """The built-ins: name -> (its module:attr string, its options)."""
        discover()
        return {name: (lazy.target, dict(lazy.options)) for name, lazy in self._declared.items()}

    def knows(self, name: str) -> bool:
        return name in self.names()

    def get(self, name: str) -> Entry[P]:
        """The entry for a name (or an import path, where the kind takes one); unknown names get a did-you-mean."""
        if is_import_path(name) and self.paths:
            try:
                return Entry(name, cast(P, load(name)))
            except (ImportError, AttributeError, TypeError, ValueError) as exc:
                raise ValueError(f"{self.config_key}={name!r}: cannot load the {self.kind}: {exc}") from exc
        discover()
        self._scan_entry_points()
        found = self._entries.get(name)
        if isinstance(found, _Lazy):  # imported outside any lock: the module may itself look names up
            lazy, (module, _, attr) = found, found.target.partition(":")
            found = Entry(name, getattr(importlib.import_module(module), attr), lazy.options)
            if self._entries.get(name) is lazy:  # unless a registration replaced it meanwhile
                self._entries[name] = found
        if found is not None:
            return found
        if name in self.reserved:
            raise UnknownPluginError(f"{self.kind} {name!r} is built from the config, not looked up by name")
        hint = allowed_hint(name, self.names()) + (f", {PATH_HINT}" if self.paths else "")
        raise UnknownPluginError(f"{self.config_key}: unknown {self.kind} {name!r}; {hint}")

    def config_error(self, value: str, what: str = "not an allowed value") -> ConfigError | None:
        """The config rule for a field this registry backs: a known name, or a well-formed import path (whether
        its function is there is read in pre-flight: slimecli/launch/source_checks.py `plugin_functions`)."""
        if is_import_path(value) and self.paths:
            problem = syntax_error(value)
            return ConfigError(self.config_key, value, f"cannot find the {self.kind}: {problem}") if problem else None
        if self.knows(value):
            return None
        hint = allowed_hint(value, self.names()) + (f", {PATH_HINT}" if self.paths else "")
        return ConfigError(self.config_key, value, what, hint)

    # ---- tests ------------------------------------------------------------------------------------------------
    @contextmanager
    def scoped(self) -> Iterator[Registry[P]]:
        """What is registered inside the with-block is gone after it, and what it replaced comes back."""
        discover()
        saved, declared, origins = dict(self._entries), dict(self._declared), dict(self._origins)
        self._scanned = False  # packages installed before the block are seen in it
        try:
            yield self
        finally:
            self._entries.clear()
            self._entries.update(saved)
            self._declared.clear()
            self._declared.update(declared)
            self._origins.clear()
            self._origins.update(origins)
            self._scanned = False  # packages installed inside the block are forgotten with it

    @contextmanager
    def override(self, **objs: P) -> Iterator[Registry[P]]:
        """``name=obj`` entries for the duration of a with-block, replacing what those names are bound to."""
        with self.scoped():
            for name, obj in objs.items():
                self._bind(name, obj, {}, replace=True)
            yield self


REWARDS: Registry[RewardFn] = Registry("reward", "reward.name", reserved=("python", "remote", "judge"))
ADVANTAGE_ESTIMATORS: Registry[AdvantageFn] = Registry("advantage estimator", "trainer.advantage_estimator", paths=True)
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss", "trainer.policy_loss", paths=True)
OFF_POLICY_CORRECTIONS: Registry[OffPolicyFn] = Registry("off-policy correction", "trainer.off_policy_correction",
                                                         paths=True, reserved=("none",))
GENERATE_KINDS: Registry[GenerateFactory] = Registry("rollout function", "rollout.generate", paths=True)
# a harness class, with its adapter class as the option `adapter`
AGENTS: Registry[type[Any]] = Registry("agent", "agent.name")
SANDBOXES: Registry[type[Any]] = Registry("sandbox", "sandbox.name")  # a Sandbox class
# env.id of env=native: slimecli's built-in environments, those installed packages declare in the entry-point
# group slimecli.environments, and import paths
ENVIRONMENTS: Registry[EnvFactory] = Registry("environment", "env.id", paths=True, entry_points="slimecli.environments")
KINDS: tuple[Registry[Any], ...] = (REWARDS, ADVANTAGE_ESTIMATORS, POLICY_LOSSES, OFF_POLICY_CORRECTIONS, GENERATE_KINDS, AGENTS, SANDBOXES, ENVIRONMENTS)
