"""User reward functions named by a path: `package.module:function` or `/path/to/file.py:function`.

The config rules check such a path without importing anything (slimecli.config.import_path, which
`check_reward_path` is); `load_reward_fn` imports it when rewards are computed.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slimecli.config.import_path import FORMAT_HINT, split_path
from slimecli.config.import_path import check_import_path as check_reward_path

__all__ = ["FORMAT_HINT", "check_reward_path", "load_reward_fn", "split_path"]

_CACHE: dict[str, Callable[..., Any]] = {}
_LOCK = threading.Lock()


def load_reward_fn(spec: str) -> Callable[..., Any]:
    """Import the function `spec` names (cached per spec); raises ImportError/AttributeError/ValueError."""
    with _LOCK:
        if spec in _CACHE:
            return _CACHE[spec]
        target, attr, is_file = split_path(spec)
        if is_file:
            path = Path(target).expanduser().resolve()
            name = f"slimecli_user_reward_{hashlib.sha1(str(path).encode()).hexdigest()[:12]}"
            module_spec = importlib.util.spec_from_file_location(name, path)
            if module_spec is None or module_spec.loader is None:
                raise ImportError(f"cannot load reward file {path}")
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module
            try:
                module_spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)
                raise
        else:
            module = importlib.import_module(target)
        fn = getattr(module, attr, None)
        if fn is None:
            raise AttributeError(f"reward path {spec!r}: {target} has no attribute {attr!r}")
        if not callable(fn):
            raise TypeError(f"reward path {spec!r}: {attr} is a {type(fn).__name__}, not a function")
        _CACHE[spec] = fn
        return fn
