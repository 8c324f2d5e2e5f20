"""Lower layers never import upper ones, with no exception, and no module is part of an import circle: every import
statement of the package, lazy and TYPE_CHECKING ones included, and every `slimecli.module:attr` string (a plugin
built-in is imported by name when first looked up).

The layers, lowest first. A package may import the packages of lower layers, never one of its own layer
(peers stay independent) nor one above. `slimecli/foo.py` counts as a package `foo`; `slimecli/__init__.py`
(the version) is `slimecli`, below everything, and `slimecli/__main__.py` is `__main__`, the top.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "slimecli"
SKIP = (PACKAGE / "swe" / "data",)  # the built-in task repositories: their own code, not slimecli's

LAYERS: list[tuple[str, ...]] = [
    ("slimecli",),  # __version__
    ("config", "net", "process", "quick_exit", "checkpoint"),  # the schema and its rules; HTTP plumbing; process
    # groups; ending a process without the teardown;
    # checkpoint directories (the controller checks them, the trainer writes and loads them)
    ("model", "observe", "sandbox"),
    ("swe", "engine", "reward"),  # SWE tasks, workspaces and grading (in sandboxes); the embedded inference server;
    # rewards (a judge renders its prompt with the model layer's tokenizer)
    ("rollout",),  # samples, the engine client, the collect loop and the single-turn driver
    ("teacher", "agent", "env"),  # the teacher server and client; agent CLIs, adapters, trajectories; RL environments
    ("launch",),  # the process plan, preflight checks (agent, teacher, sandbox) and the supervisor
    ("eval",),  # held-out evaluation: the evaluator the trainer and `slimecli eval` run (launch's watchdog)
    ("train",),  # the trainer worker: uses everything below, launch's watchdog included
    ("cli",),
    ("__main__",),
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}

# A string naming an object to import: what the plugin registry's built-ins are (slimecli.config.registry).
STRING_IMPORT = re.compile(r"slimecli(\.[A-Za-z_]\w*)+:[A-Za-z_]\w*")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "slimecli"


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


@functools.cache  # each file parsed once for the layer check and the circle check
def imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every slimecli import in the file, wherever it is (functions, TYPE_CHECKING)."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:  # `from pkg import sub` imports the module pkg.sub where there is one
                sub = f"{target}.{alias.name}"
                found.append((node.lineno, sub if is_module(sub) else target))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and STRING_IMPORT.fullmatch(node.value):
            found.append((node.lineno, node.value.partition(":")[0]))
    return [(line, name) for line, name in found if name == "slimecli" or name.startswith("slimecli.")]


def sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if not any(p.is_relative_to(s) for s in SKIP))


def graph() -> list[tuple[str, int, str, str]]:
    """(file, line, importing module, imported module) for every import between two different packages."""
    edges = []
    for path in sources():
        module = module_name(path)
        for line, target in imports(path):
            if layer_of(target) != layer_of(module):
                edges.append((str(path.relative_to(ROOT)), line, module, target))
    return edges


def test_every_package_has_a_layer():
    packages = {layer_of(module_name(p)) for p in sources()}
    missing = sorted(packages - set(LAYER))
    assert not missing, f"add {missing} to LAYERS in {Path(__file__).name} (which layer may it import?)"
    assert not set(LAYER) - packages, "LAYERS names a package that no longer exists"


def test_lower_layers_never_import_upper_ones():
    bad = []
    for where, line, module, target in graph():
        low, high = layer_of(module), layer_of(target)
        if LAYER[high] >= LAYER[low]:
            kind = "its peer" if LAYER[high] == LAYER[low] else "the upper layer"
            bad.append(f"{where}:{line}: {module} ({low}) imports {target}, {kind} {high}")
    assert not bad, "layer violations (see LAYERS):\n" + "\n".join(bad)


def circles() -> list[list[str]]:
    """Every import circle between the package's modules (strongly connected parts of the import graph)."""
    edges: dict[str, set[str]] = {module_name(p): set() for p in sources()}
    for path in sources():
        module = module_name(path)
        edges[module] |= {t for _, t in imports(path) if t in edges and t != module}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while not part or part[-1] != v:
                part.append(stack.pop())
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    """No module imports one that (through others) imports it, lazily or not: a circle is one module in two files."""
    assert circles() == []


def test_the_circle_finder_finds_a_lazy_circle(tmp_path, monkeypatch):
    pkg = tmp_path / "slimecli" / "swe"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from slimecli.swe import b\n")
    (pkg / "b.py").write_text("def f():\n    from slimecli.swe.c import x\n")
    (pkg / "c.py").write_text("import slimecli.swe.a\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "slimecli")
    assert circles() == [["slimecli.swe.a", "slimecli.swe.b", "slimecli.swe.c"]]


def test_the_checker_sees_lazy_and_relative_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "slimecli" / "config"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "x.py").write_text("def f():\n    from ..train import loop\n    import slimecli.cli.app\n"
                              "    from . import y\n")
    (pkg / "y.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert sorted(name for _, name in imports(pkg / "x.py")) == ["slimecli.cli.app", "slimecli.config.y",
                                                                 "slimecli.train"]


# ---- the plugin registry: built-ins declared by the packages that own them ----------------------------------
def test_the_checker_sees_string_named_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "slimecli" / "reward"
    pkg.mkdir(parents=True)
    (pkg / "plugins.py").write_text('REWARDS.builtin("q", "slimecli.rollout.quickstart:quickstart_reward")\n'
                                    'NOTE = "see slimecli.rollout for more"\n')
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert imports(pkg / "plugins.py") == [(1, "slimecli.rollout.quickstart")]


def test_every_declaring_package_is_discovered_and_declares_only():
    """The registry imports each package's plugins.py before the first lookup: the list is the files, and each
    file imports nothing but the registry (declaring never pulls in an implementation, nor torch)."""
    from slimecli.config.registry import DECLARED_IN

    files = sorted(module_name(p) for p in sources() if p.name == "plugins.py")
    assert sorted(DECLARED_IN) == files
    for module in files:
        tree = ast.parse(ROOT.joinpath(*module.split(".")).with_suffix(".py").read_text(encoding="utf-8"))
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert imported <= {"slimecli.config.registry"}, f"{module} imports {sorted(imported)}"


def test_every_built_in_names_a_function_that_exists():
    """Checked without importing: the module is found and defines the name (an agent's adapter class too)."""
    from slimecli.config.import_path import check_import_path
    from slimecli.config.registry import KINDS

    for registry in KINDS:
        for name, (target, options) in registry.declared().items():
            strings = [target, *(v for v in options.values() if isinstance(v, str) and STRING_IMPORT.fullmatch(v))]
            assert [check_import_path(t) for t in strings] == [None] * len(strings), (registry.kind, name)


def test_a_reward_registered_at_run_time_validates_in_the_same_process():
    from slimecli.config.compose import load
    from slimecli.config.errors import ConfigErrors
    from slimecli.reward.registry import register_reward, scoped_rewards

    with scoped_rewards():
        with pytest.raises(ConfigErrors, match="unknown reward"):
            load(["reward.name=test_layers_late"])
        register_reward("test_layers_late", lambda sample: 1.0)
        assert load(["reward.name=test_layers_late"]).reward.name == "test_layers_late"
    with pytest.raises(ConfigErrors, match="unknown reward"):  # and forgotten after the scope
        load(["reward.name=test_layers_late"])
