"""What goes into a task's environment, read from the repository at the commit its environment is built from.

The cache key covers everything a build depends on (interpreter, installer, runner, the dependency files'
contents, the row's `install` list), and nothing else: tasks of one repository whose dependency files did not
change between their commits share one venv, and a changed requirement gets a new one.
"""

from __future__ import annotations

import configparser
import hashlib
import importlib.util
import json
import platform
import re
import sys
import tomllib
from dataclasses import asdict, dataclass
from typing import Any, Literal

from slimecli.swe.task import SweTask

FORMAT = 1  # bump when a build would make something different from the same inputs
RUNNER = ("pytest",)  # the grader's test runner: always in a built environment
PROJECT_FILES = ("pyproject.toml", "setup.py", "setup.cfg")
REQUIREMENTS_DIR = "requirements"
TEST_EXTRAS = ("test", "tests", "testing")
_REQUIREMENTS = re.compile(r"^(requirements[\w.-]*\.txt|requirements/[\w.-]+\.txt)$")

Kind = Literal["host", "venv", "image"]


class SpecError(Exception):
    """The repository's dependency files cannot be read or make no sense (`field` names the row's key)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class EnvSpec:
    """Every input of one build; `key()` names its cache directory."""

    kind: Literal["runner", "venv"]  # runner: only the test runner (host tasks, when slimecli lacks one)
    python: str  # the base interpreter the venv is made from
    python_version: str
    installer: str  # pip | uv
    runner: tuple[str, ...]
    install: tuple[str, ...] = ()  # the row's own requirements
    requirement_files: tuple[str, ...] = ()  # paths in the repository, installed with -r
    project: bool = False  # install the repository for its declared dependencies, then remove the project itself
    extras: tuple[str, ...] = ()  # its test extras
    files: tuple[tuple[str, str], ...] = ()  # (path, sha256) of every dependency file read

    def key(self) -> str:
        blob = json.dumps({"format": FORMAT, **asdict(self)}, sort_keys=True).encode()
        return f"{self.kind}-{hashlib.sha256(blob).hexdigest()[:16]}"


@dataclass(frozen=True)
class Plan:
    """One task's environment: its kind, and for a built one the spec and the commit it is built from."""

    kind: Kind
    why: str  # how `auto` chose, or "task.environment=KIND"
    spec: EnvSpec | None = None
    commit: str = ""


def base_python() -> tuple[str, str]:
    """(the real interpreter behind this one, its version): what venvs are made from."""
    import os

    return os.path.realpath(sys.executable), platform.python_version()


def host_has_runner() -> bool:
    """slimecli's own interpreter can run the tests (a dev install); a plain install cannot."""
    return importlib.util.find_spec("pytest") is not None


def runner_spec(installer: str) -> EnvSpec:
    python, version = base_python()
    return EnvSpec("runner", python, version, installer, RUNNER)


def _is_dependency_file(path: str) -> bool:
    return path in PROJECT_FILES or bool(_REQUIREMENTS.match(path))


def _declares(files: dict[str, bytes]) -> tuple[bool, tuple[str, ...]]:
    """(whether the project declares dependencies, its test extras), from pyproject, setup.cfg and setup.py."""
    declares, extras = False, set()
    if "pyproject.toml" in files:
        try:
            data = tomllib.loads(files["pyproject.toml"].decode())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise SpecError("pyproject.toml", f"not valid TOML: {exc}") from None
        project: dict[str, Any] = data.get("project") or {}
        declares = bool(project.get("dependencies")) or "dependencies" in project.get("dynamic", ())
        extras |= set(project.get("optional-dependencies") or {}) & set(TEST_EXTRAS)
    if "setup.cfg" in files:
        cfg = configparser.ConfigParser(interpolation=None)
        try:
            cfg.read_string(files["setup.cfg"].decode())
        except (configparser.Error, UnicodeDecodeError) as exc:
            raise SpecError("setup.cfg", f"cannot be parsed: {exc}") from None
        declares |= bool(cfg.get("options", "install_requires", fallback="").strip())
        if cfg.has_section("options.extras_require"):
            extras |= set(cfg.options("options.extras_require")) & set(TEST_EXTRAS)
    if "setup.py" in files:
        text = files["setup.py"].decode(errors="replace")
        declares |= "install_requires" in text
        extras |= {e for e in TEST_EXTRAS if re.search(rf"""['"]{e}['"]\s*:""", text)}
    return declares, tuple(sorted(extras))


def read_spec(task: SweTask, installer: str) -> tuple[EnvSpec, str, bool]:
    """(the venv spec of `task`, the commit it is built from, whether the repository declares dependencies).

    The commit is the row's environment_setup_commit when it names one (SWE-bench's convention), else its
    base commit. WorkspaceError when the repository or commit cannot be read."""
    from slimecli.swe.workspace import read_at_commit

    commit = task.environment_setup_commit or task.base_commit
    sha, files = read_at_commit(task, commit, _is_dependency_file, dirs=(REQUIREMENTS_DIR,))
    declares, extras = _declares(files)
    requirements = tuple(sorted(p for p in files if _REQUIREMENTS.match(p)))
    project = any(p in files for p in PROJECT_FILES) and (declares or bool(extras))
    python, version = base_python()
    spec = EnvSpec("venv", python, version, installer, RUNNER, install=task.install, requirement_files=requirements,
                   project=project, extras=extras if project else (),
                   files=tuple(sorted((p, hashlib.sha256(b).hexdigest()) for p, b in files.items())))
    return spec, sha, declares or bool(requirements) or bool(task.install)


def plan(task: SweTask, environment: str, installer: str, container: bool) -> Plan:
    """The environment `task` gets under task.environment=`environment`; `container`: the sandbox is podman or
    docker. WorkspaceError / SpecError when the repository cannot be read."""
    if environment == "image" or (environment == "auto" and task.image and container):
        return Plan("image", "the row names an image" if environment == "auto" else "task.environment=image")
    if environment == "host":
        return Plan("host", "task.environment=host")
    spec, commit, declares = read_spec(task, installer)
    if environment == "venv" or declares:
        why = "task.environment=venv" if environment == "venv" else "the repository declares dependencies"
        return Plan("venv", why, spec, commit)
    return Plan("host", "the repository declares no dependencies")

