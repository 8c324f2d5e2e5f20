"""Pinned agent CLIs from npm, installed into slimecli's tools directory, and how to find them again."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

TOOLS_ENV = "SLIMECLI_TOOLS_DIR"


@dataclass(frozen=True)
class CliPackage:
    agent: str
    package: str
    version: str
    binary: str

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"


# Versions the adapters were checked against (request shapes captured from these builds).
PACKAGES = {
    "claude_code": CliPackage("claude_code", "@anthropic-ai/claude-code", "2.1.332", "claude"),
    "codex": CliPackage("codex", "@openai/codex", "0.171.0", "codex"),
}


def tools_dir(configured: str | None = None) -> Path:
    """agent.tools_dir, else $SLIMECLI_TOOLS_DIR, else ~/.cache/slimecli/tools."""
    value = configured or os.environ.get(TOOLS_ENV) or "~/.cache/slimecli/tools"
    return Path(value).expanduser()


def package(agent: str) -> CliPackage:
    try:
        return PACKAGES[agent]
    except KeyError:
        raise ValueError(f"no CLI package for agent {agent!r}; valid: {', '.join(sorted(PACKAGES))}") from None


def install_command(agent: str, configured_dir: str | None = None) -> list[str]:
    pkg = package(agent)
    prefix = tools_dir(configured_dir) / agent
    return ["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error", pkg.spec]


def install(agent: str, configured_dir: str | None = None) -> Path:
    """npm install the pinned package; returns the binary path. Raises RuntimeError with npm's message."""
    if shutil.which("npm") is None:
        raise RuntimeError("npm not found: install Node.js (>= 20) and npm first")
    cmd = install_command(agent, configured_dir)
    Path(cmd[3]).mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr.strip()[-2000:]}")
    binary = installed_binary(agent, configured_dir)
    if binary is None:
        raise RuntimeError(f"{package(agent).spec} installed but its binary was not found under {cmd[3]}")
    return binary


def installed_binary(agent: str, configured_dir: str | None = None) -> Path | None:
    pkg = package(agent)
    modules = tools_dir(configured_dir) / agent / "node_modules"
    path = modules / ".bin" / pkg.binary
    if not (path.exists() and os.access(path, os.X_OK)):
        return None
    if agent == "claude_code" and path.resolve().stat().st_size < (1 << 20):
        # The launcher is a placeholder until the package's postinstall copies the native binary over it;
        # where npm skipped install scripts, use the platform package's binary directly.
        native = sorted(modules.glob("@anthropic-ai/claude-code-*/claude"))
        return native[0] if native else None
    return path


def locate(agent: str, binary: str | None = None, configured_dir: str | None = None) -> str | None:
    """agent.binary if given, else the installed CLI, else the one on PATH; None when there is none."""
    if binary:
        found = shutil.which(binary) if os.sep not in binary else (binary if os.access(binary, os.X_OK) else None)
        return str(Path(found).absolute()) if found else None
    installed = installed_binary(agent, configured_dir)
    if installed is not None:
        return str(installed)
    on_path = shutil.which(package(agent).binary)
    return on_path
