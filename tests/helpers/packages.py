"""Environments installed as real packages, the way their users install them: `pip install --no-deps` of a
package directory into a target folder of the test's own, with its dist-info (entry points included), put on
sys.path for this process and on PYTHONPATH for its children."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path


def install_package(source: Path, target: Path) -> Path:
    """Install the package directory `source` (a pyproject.toml project) into `target` and make it importable
    here; returns `target`."""
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "--target", str(target), str(source)],
                   check=True, capture_output=True, text=True)
    if str(target) not in sys.path:
        sys.path.insert(0, str(target))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(target), os.environ.get("PYTHONPATH", "")) if p)
    importlib.invalidate_caches()
    return target


def write_package(root: Path, name: str, files: dict[str, str], entry_points: dict[str, dict[str, str]]
                  | None = None, dependencies: tuple[str, ...] = ()) -> Path:
    """A minimal hatchling project at root/name: `files` maps paths (relative to the project) to their text."""
    project = root / name
    project.mkdir(parents=True, exist_ok=True)
    lines = ["[build-system]", 'requires = ["hatchling"]', 'build-backend = "hatchling.build"', "",
             "[project]", f'name = "{name}"', 'version = "0.1.0"', f"dependencies = {list(dependencies)!r}"]
    for group, points in (entry_points or {}).items():
        lines += ["", f'[project.entry-points."{group}"]', *(f'{k} = "{v}"' for k, v in points.items())]
    packages = sorted({Path(p).parts[0] for p in files if len(Path(p).parts) > 1})
    if packages:
        lines += ["", "[tool.hatch.build.targets.wheel]", f"packages = {packages!r}"]
    (project / "pyproject.toml").write_text("\n".join(lines) + "\n")
    for rel, text in files.items():
        path = project / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return project
