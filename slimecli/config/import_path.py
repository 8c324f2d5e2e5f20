"""Functions named by an import path: `package.module:function` or `/path/to/file.py:function`.

A config names user functions this way (reward.path, rollout.generate, trainer.advantage_estimator,
trainer.policy_loss). `syntax_error` is the config rules' check (the text alone); `check_import_path` is
pre-flight's (slimecli/launch/source_checks.py): it finds the file or module and reads it without importing
(or executing) anything, so `slimecli config` stays fast and never pulls in torch through a user module;
`load` imports the function when the package that calls it needs it (the project's one loader).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.machinery
import importlib.util
import logging
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FORMAT_HINT = "use package.module:function or /path/to/file.py:function"
# The hint after the allowed names of a registry-backed field (trainer.advantage_estimator, ...).
PATH_HINT = "or an import path package.module:function or /path/to/file.py:function"


def is_import_path(name: str) -> bool:
    """A value with a ':' names a function to import; registered names never contain one."""
    return ":" in str(name)


def split_path(spec: str) -> tuple[str, str, bool]:
    """(module or file, function, is_file); raises ValueError when malformed."""
    target, sep, attr = str(spec).strip().rpartition(":")
    if not sep or not target or not attr:
        raise ValueError(f"{spec!r} has no ':function' part")
    if not attr.isidentifier():
        raise ValueError(f"{attr!r} is not a Python identifier")
    is_file = target.endswith(".py") or "/" in target or "\\" in target
    if not is_file and not all(part.isidentifier() for part in target.split(".")):
        raise ValueError(f"{target!r} is neither a module name nor a .py file")
    return target, attr, is_file


def syntax_error(spec: str) -> str | None:
    """Why `spec` is not a well-formed import path, or None; reads nothing."""
    try:
        split_path(spec)
    except ValueError as exc:
        return f"{exc}; {FORMAT_HINT}"
    return None


def find_module_spec(name: str) -> importlib.machinery.ModuleSpec | None:
    """Locate a module like importlib.util.find_spec, but without importing its parent packages."""
    if name in sys.modules:
        return getattr(sys.modules[name], "__spec__", None) or importlib.machinery.ModuleSpec(name, None)
    parts = name.split(".")
    spec = None
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(parts[0], None)
        except Exception as exc:  # noqa: BLE001 - a third-party finder misbehaving is not the user's problem
            log.debug("meta path finder %r failed on %r: %s", find, parts[0], exc)
            spec = None
        if spec is not None:
            break
    for i in range(1, len(parts)):
        if spec is None or not spec.submodule_search_locations:
            return None
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), list(spec.submodule_search_locations))
    return spec


def _top_level_names(source: str) -> tuple[set[str], set[str]] | None:
    """(names a module may define at top level, the functions among them); any branch counts.
    None when it cannot be told statically."""
    names: set[str] = set()
    functions: set[str] = set()

    def visit(body: list[ast.stmt]) -> bool:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                functions.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    if alias.name == "*":
                        return False
                    names.add((alias.asname or alias.name).split(".")[0])
            elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
                blocks = [getattr(node, f, []) for f in ("body", "orelse", "finalbody")]
                blocks += [h.body for h in getattr(node, "handlers", [])]
                if not all(visit(b) for b in blocks):
                    return False
        return True

    if not visit(ast.parse(source).body) or "__getattr__" in names or "globals" in source:
        return None
    return names, functions


def _check_defined(source_path: Path, attr: str, where: str) -> str | None:
    if attr.startswith("__") and attr.endswith("__"):
        return None
    try:
        found = _top_level_names(source_path.read_text(encoding="utf-8"))
    except SyntaxError as exc:
        return f"{where} has a syntax error (line {exc.lineno}): {exc.msg}"
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if found is not None and attr not in found[0]:
        defined = sorted(n for n in found[1] if not n.startswith("_"))
        listing = f"; it defines: {', '.join(defined[:12])}" if defined else ""
        return f"{where} defines no {attr!r}{listing}"
    return None


def check_import_path(spec: str) -> str | None:
    """Why `spec` cannot name a function, or None when it looks loadable. Imports nothing."""
    problem = syntax_error(spec)
    if problem:
        return problem
    target, attr, is_file = split_path(spec)
    if is_file:
        path = Path(target).expanduser()
        if not path.is_file():
            return f"file {target} does not exist"
        return _check_defined(path, attr, f"file {target}")
    try:
        module_spec = find_module_spec(target)
    except (ImportError, ValueError) as exc:
        return f"module {target} cannot be located: {exc}"
    if module_spec is None:
        return f"module {target} not found on the Python path"
    origin = getattr(module_spec, "origin", None)
    if origin and str(origin).endswith(".py") and Path(origin).is_file():
        return _check_defined(Path(origin), attr, f"module {target}")
    return None


_LOADED: dict[str, Callable[..., Any]] = {}
_LOADING = threading.Lock()


def load(spec: str) -> Callable[..., Any]:
    """Import the function (or class) `spec` names, once per spec; raises ImportError/AttributeError/TypeError/
    ValueError. A file is imported as a module of its own name, so two files may hold the same function name."""
    with _LOADING:
        if spec in _LOADED:
            return _LOADED[spec]
        target, attr, is_file = split_path(spec)
        if is_file:
            path = Path(target).expanduser().resolve()
            name = f"slimecli_user_{hashlib.sha1(str(path).encode()).hexdigest()[:12]}"
            module_spec = importlib.util.spec_from_file_location(name, path)
            if module_spec is None or module_spec.loader is None:
                raise ImportError(f"cannot load file {path}")
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module
            try:
                module_spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)
                raise
        else:
            module = importlib.import_module(target)
        found = getattr(module, attr, None)
        if found is None:
            raise AttributeError(f"{spec!r}: {target} has no attribute {attr!r}")
        if not callable(found):
            raise TypeError(f"{spec!r}: {attr} is a {type(found).__name__}, not a function")
        fn: Callable[..., Any] = found
        _LOADED[spec] = fn
        return fn
