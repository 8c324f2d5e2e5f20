"""Hermetic git: one git command with no user or system configuration, and git-style diffs made without git.
The lowest part of the package that touches repositories: the workspace, the built-in sets and the task
makers all run git through here."""

from __future__ import annotations

import difflib
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

GIT_FLAGS = ("-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main", "-c", "core.autocrlf=false",
             "-c", "core.fsmonitor=false", "-c", "advice.detachedHead=false")


class GitError(Exception):
    def __init__(self, args: tuple[str, ...], returncode: int, stderr: str) -> None:
        self.returncode = returncode
        self.stderr = stderr.strip()
        super().__init__(f"git {' '.join(args)} exited {returncode}: {self.stderr or '(no message)'}")


def git_env(home: str | Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without any GIT_* variable, with no global/system config and HOME at `home`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_ATTR_NOSYSTEM": "1",
                "GIT_TERMINAL_PROMPT": "0", "HOME": str(home), "XDG_CONFIG_HOME": str(home), "LC_ALL": "C"})
    env.update(extra or {})
    return env


def run_git(*args: str, home: str | Path, cwd: str | Path | None = None, input: bytes | None = None,
            env: Mapping[str, str] | None = None, raw: bool = False) -> str:
    """stdout of one hermetic git command (without its final newline unless `raw`); GitError when it fails."""
    proc = subprocess.run(["git", *GIT_FLAGS, *args], cwd=cwd, input=input, capture_output=True,
                          env=git_env(home, env))
    if proc.returncode != 0:
        raise GitError(args, proc.returncode, proc.stderr.decode(errors="replace"))
    out = proc.stdout.decode()
    return out if raw else out.rstrip("\n")


def file_diff(path: str, old: str | None, new: str | None) -> str:
    """A git-style diff of one file (None: the file does not exist on that side), without running git."""
    head = f"diff --git a/{path} b/{path}\n"
    if old is None:
        head += "new file mode 100644\n"
    elif new is None:
        head += "deleted file mode 100644\n"
    lines = difflib.unified_diff((old or "").splitlines(keepends=True), (new or "").splitlines(keepends=True),
                                 "/dev/null" if old is None else f"a/{path}", "/dev/null" if new is None else f"b/{path}")
    body = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
    return head + body
