"""One adapter per environment library: env.name -> the module whose `load(id, args, cfg)` gives an EnvProvider
and whose `available()` lists what is installed (each imports its library only when called)."""

from __future__ import annotations

import importlib
from types import ModuleType

from slimecli.env.provider import EnvLoadError

ADAPTERS: dict[str, str] = {
    "native": "slimecli.env.adapters.native",
    "verifiers": "slimecli.env.adapters.verifiers",
    "openenv": "slimecli.env.adapters.openenv",
    "skyrl_gym": "slimecli.env.adapters.skyrl_gym",
    "reasoning_gym": "slimecli.env.adapters.reasoning_gym",
}
# the pip extra that installs each library (pip install 'slimecli[NAME]')
EXTRAS: dict[str, str] = {"verifiers": "verifiers", "openenv": "openenv", "skyrl_gym": "skyrl-gym",
                          "reasoning_gym": "reasoning-gym"}


def adapter(kind: str) -> ModuleType:
    if kind not in ADAPTERS:
        raise KeyError(f"env.name: unknown environment kind {kind!r}; allowed: {', '.join(ADAPTERS)}")
    return importlib.import_module(ADAPTERS[kind])


def install_hint(kind: str) -> str:
    """The command that installs `kind`'s library: its pip extra."""
    return f"pip install 'slimecli[{EXTRAS[kind]}]'"


def library(kind: str, module: str, what: str) -> ModuleType:
    """`module` of an adapter's library, imported when first needed (importing the adapter never imports it), or
    an EnvLoadError saying which extra installs `what`."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise EnvLoadError(f"env={kind} needs {what}: {install_hint(kind)} ({exc})") from exc
