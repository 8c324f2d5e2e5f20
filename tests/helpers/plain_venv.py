"""The install a user has: a venv holding what a non-editable `pip install .` with no extras installs, and nothing
else (no pytest, no extra's package), made with no download.

slimecli itself is a wheel built from this checkout and installed by pip; its dependencies, and theirs, are
links to this venv's copies (the versions constraints.txt pins, as `pip install -c constraints.txt .` would
install). Which distributions those are is read from pyproject.toml's dependencies and each installed
distribution's own requirements, markers evaluated, extras left out.

`shared_plain_install` makes it once per test session, whichever pytest-xdist worker asks first.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

from tests.helpers import ROOT

READY = ".plain-install-ready"


def base_distributions() -> dict[str, md.Distribution]:
    """Every distribution `pip install .` brings (slimecli's dependencies and theirs), by canonical name."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    todo = list(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    found: dict[str, md.Distribution] = {}
    while todo:
        req = Requirement(todo.pop())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # another platform's, or an extra's
        name = canonicalize_name(req.name)
        if name in found:
            continue
        dist = md.distribution(name)  # PackageNotFoundError: this venv lacks a dependency (make setup)
        found[name] = dist
        todo += dist.requires or []
    return found


def _top_level(dist: md.Distribution) -> set[str]:
    """The entries a distribution puts directly in site-packages (packages, modules, its dist-info, .pth files)."""
    names = set()
    for file in dist.files or []:
        parts = Path(str(file)).parts
        if parts and parts[0] != ".." and parts[0] != "__pycache__":
            names.add(parts[0])
    return names


def build_wheel(out: Path) -> Path:
    """slimecli's wheel, built from this checkout (hatchling, as `pip install .` builds it)."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "--disable-pip-version-check", "-w", str(out), str(ROOT)], check=True, capture_output=True)
    (wheel,) = out.glob("slimecli-*.whl")
    return wheel


def plain_install(root: Path) -> Path:
    """The plain install at ``root`` (a venv); returns its python. ``root``/bin/slimecli is the console script."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    site = next(root.glob("lib/python*/site-packages"))
    here = Path(next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix)))
    for dist in base_distributions().values():
        for name in _top_level(dist):
            if (here / name).exists() and not (site / name).exists():
                (site / name).symlink_to(here / name)
    wheel = build_wheel(root.parent / "wheel")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-index", "--disable-pip-version-check", str(wheel)],
                   check=True, capture_output=True)
    return root / "bin" / "python"


def shared_plain_install(base_temp: Path) -> Path:
    """The session's plain install (built by the first worker that asks; the others wait for it): its python.
    ``base_temp``: tmp_path_factory.getbasetemp()."""
    from filelock import FileLock

    shared = base_temp.parent if os.environ.get("PYTEST_XDIST_WORKER") else base_temp
    root = shared / "plain-install"
    with FileLock(str(shared / "plain-install.lock")):
        if not (root / READY).is_file():
            root.mkdir(parents=True, exist_ok=True)
            plain_install(root / "venv")
            (root / READY).write_text("")
    return root / "venv" / "bin" / "python"
