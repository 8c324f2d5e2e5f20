"""Making one venv from an EnvSpec, outside any sandbox and with network, every command logged.

What goes in: the test runner, the row's `install` list, the repository's requirements files, and the
repository itself (with its test extras) so that its declared dependencies come along, whatever build back-end
declares them; the project's own distribution is then removed again, so the tests import the workspace the
agent edited, never a copy of the base. pip runs from slimecli's interpreter when that has pip (no pip is put
into the venv: faster), else from the venv; `uv` when task.env_installer=uv.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from dataclasses import replace
from pathlib import Path
from typing import Any

from slimecli.swe.env.spec import EnvSpec
from slimecli.swe.env.store import BuildFailed
from slimecli.swe.task import SweTask

STEP_TIMEOUT_S = 1800.0
TAIL = 600


def uv_binary() -> str | None:
    return shutil.which("uv")


def installer_problem(installer: str) -> str | None:
    """Why environments cannot be built with `installer` on this machine, else None."""
    if installer == "uv":
        return None if uv_binary() else "task.env_installer=uv but uv is not installed (pip install uv)"
    if importlib.util.find_spec("venv") is None:
        return "this Python has no venv module (Debian/Ubuntu: apt-get install python3-venv)"
    if importlib.util.find_spec("pip") is None and importlib.util.find_spec("ensurepip") is None:
        return "this Python has neither pip nor ensurepip to install packages (install python3-pip, or use uv)"
    return None


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def _run(argv: list[str], log: Path, what: str, reason: str, env: dict[str, str] | None = None) -> str:
    with log.open("a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        try:
            proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  timeout=STEP_TIMEOUT_S, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            out.write(f"timed out after {STEP_TIMEOUT_S:.0f}s\n")
            raise BuildFailed(reason, f"{what} took over {STEP_TIMEOUT_S:.0f}s", log) from None
        except OSError as exc:
            raise BuildFailed(reason, f"{what}: cannot run {argv[0]}: {exc.strerror or exc}", log) from None
        out.write(proc.stdout + f"[exit {proc.returncode}]\n")
    if proc.returncode != 0:
        tail = proc.stdout.strip()
        last = tail.splitlines()[-1] if tail else f"exit {proc.returncode}"
        if "No space left on device" in tail:
            raise BuildFailed("disk", f"{what}: no space left on device", log)
        raise BuildFailed(reason, f"{what} failed: {last[-TAIL:]}", log)
    return proc.stdout


class Installer:
    """The commands of one installer for one venv."""

    def __init__(self, spec: EnvSpec, venv: Path, log: Path) -> None:
        self.spec, self.venv, self.log = spec, venv, log
        self.uv = uv_binary() if spec.installer == "uv" else None
        if spec.installer == "uv" and self.uv is None:
            raise BuildFailed("installer", "task.env_installer=uv but uv is not installed", log)
        self.host_pip = self.uv is None and importlib.util.find_spec("pip") is not None

    def create(self) -> None:
        if self.uv:
            argv = [self.uv, "venv", "--quiet", "--python", self.spec.python, str(self.venv)]
        else:
            argv = [self.spec.python, "-m", "venv", *(["--without-pip"] if self.host_pip else []), str(self.venv)]
        _run(argv, self.log, "creating the venv", "venv")

    def _pip(self) -> list[str]:
        if self.uv:
            return [self.uv, "pip"]
        if self.host_pip:
            return [sys.executable, "-m", "pip", "--python", str(python_of(self.venv)), "--disable-pip-version-check",
                    "--no-input"]
        return [str(python_of(self.venv)), "-m", "pip", "--disable-pip-version-check", "--no-input"]

    def install(self, requirements: list[str], report: Path | None) -> None:
        argv = [*self._pip(), "install"]
        if self.uv:
            argv += ["--python", str(python_of(self.venv))]
        elif report is not None:
            argv += ["--report", str(report)]
        _run([*argv, *requirements], self.log, "installing the requirements", "install")

    def uninstall(self, name: str) -> None:
        argv = [*self._pip(), "uninstall"]
        argv += ["--python", str(python_of(self.venv))] if self.uv else ["-y"]
        _run([*argv, name], self.log, f"removing the project's own {name}", "install")


def _project_name(report: Path, checkout: Path, log: Path) -> str | None:
    """The distribution pip installed from `checkout` (from its --report), so that it can be removed again."""
    try:
        items = json.loads(report.read_text()).get("install", [])
    except (OSError, ValueError):
        return None
    want = checkout.resolve().as_uri()
    for item in items:
        url = urllib.parse.unquote((item.get("download_info") or {}).get("url", ""))
        if url.rstrip("/") == urllib.parse.unquote(want).rstrip("/"):
            return (item.get("metadata") or {}).get("name")
    return None


def _project_name_from_venv(python: Path, checkout: Path, log: Path) -> str | None:
    """uv writes no report: the distribution whose direct_url.json points at the checkout."""
    code = ("import importlib.metadata as m, json, sys\n"
            "for d in m.distributions():\n"
            "    t = d.read_text('direct_url.json')\n"
            "    if t and json.loads(t).get('url', '').rstrip('/') == sys.argv[1].rstrip('/'): print(d.metadata['Name'])\n")
    out = _run([str(python), "-c", code, checkout.resolve().as_uri()], log, "finding the project", "install")
    return out.strip().splitlines()[0] if out.strip() else None


def build_venv(spec: EnvSpec, task: SweTask | None, commit: str, venv: Path, log: Path) -> dict[str, Any]:
    """Make the venv of `spec` in the empty directory `venv`; the manifest entries to record. BuildFailed."""
    installer = Installer(spec, venv, log)
    installer.create()
    requirements = [*spec.runner, *spec.install]
    with tempfile.TemporaryDirectory(prefix="slimecli-env-") as tmp:
        checkout = Path(tmp) / "checkout"
        if spec.requirement_files or spec.project:
            from slimecli.swe.workspace import WorkspaceError, prepare

            assert task is not None
            checkout.mkdir()
            try:
                prepare(replace(task, base_commit=commit), checkout)
            except WorkspaceError as exc:
                raise BuildFailed("checkout", str(exc), log) from None
            for path in spec.requirement_files:
                requirements += ["-r", str(checkout / path)]
            if spec.project:
                requirements.append(f"{checkout}[{','.join(spec.extras)}]" if spec.extras else str(checkout))
        report = Path(tmp) / "report.json"
        installer.install(requirements, report if spec.project else None)
        if spec.project:
            name = (_project_name_from_venv(python_of(venv), checkout, log) if installer.uv
                    else _project_name(report, checkout, log))
            if name:
                installer.uninstall(name)
    probe = _run([str(python_of(venv)), "-c", "import pytest; print(pytest.__version__)"], log,
                 "probing the test runner", "runner")
    return {"spec": {k: v for k, v in spec.__dict__.items()}, "python": str(python_of(venv)),
            "runner": f"pytest {probe.strip()}", "for": task.instance_id if task else None}
