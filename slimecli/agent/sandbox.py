"""The local sandbox: a temporary workspace and home, a scrubbed environment, processes in their own group.

The contract (exec / write_file / read_file, plus start / kill for a background CLI) is what a remote sandbox
would implement too; the harness only polls a status file through read_file, so it works the same there.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

KEEP_ENV = ("LANG", "LC_ALL", "TZ")


@dataclass
class ExecResult:
    returncode: int | None  # None when killed at the time limit
    stdout: str
    stderr: str
    timed_out: bool = False


def read_exit_status(text: str | None) -> int | None:
    """Parse a status file: missing, empty or partially written means 'not finished yet' (never a crash)."""
    if text is None:
        return None
    text = text.strip()
    if not text or not text.lstrip("-").isdigit():
        return None
    return int(text)


def kill_group(pgid: int, grace_s: float = 2.0, leader: subprocess.Popen | None = None) -> None:
    """SIGTERM the whole process group, then SIGKILL whatever is left (synchronous, bounded)."""
    import time

    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if leader is not None:
                leader.poll()  # reap the leader, or its zombie keeps the group alive
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.05)


class LocalSandbox:
    def __init__(self, workdir: str | Path | None = None, path_dirs: list[str] | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="slimecli-sandbox-"))
        self.own_workdir = workdir is None
        self.workdir = Path(workdir).resolve() if workdir is not None else self.root / "workspace"
        self.home = self.root / "home"
        self.meta = self.root / "meta"  # status and output files of background commands, outside the workspace
        for d in (self.workdir, self.home, self.meta):
            d.mkdir(parents=True, exist_ok=True)
        self.path_dirs = [*(path_dirs or []), "/usr/local/bin", "/usr/bin", "/bin"]
        self._procs: dict[str, subprocess.Popen] = {}

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """Nothing of the caller's environment leaks in (no API keys, no proxies) except locale settings."""
        env = {k: os.environ[k] for k in KEEP_ENV if k in os.environ}
        env.update({"PATH": os.pathsep.join(dict.fromkeys(self.path_dirs)), "HOME": str(self.home),
                    "TMPDIR": str(self.root), "TERM": "dumb", "NO_COLOR": "1", "CI": "1"})
        env.setdefault("LANG", "C.UTF-8")
        env.update(extra or {})
        return env

    def _path(self, path: str | Path) -> Path:
        p = Path(path)
        return p if p.is_absolute() else self.workdir / p

    def write_file(self, path: str | Path, content: str | bytes) -> Path:
        p = self._path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)
        return p

    def read_file(self, path: str | Path) -> str | None:
        try:
            return self._path(path).read_text(errors="replace")
        except (FileNotFoundError, IsADirectoryError):
            return None

    async def exec(self, argv: list[str], timeout_s: float, env: dict[str, str] | None = None,
                   cwd: str | Path | None = None) -> ExecResult:
        """Run to completion or kill the process group at the time limit."""
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=str(cwd or self.workdir), env=self.env(env), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except (TimeoutError, asyncio.CancelledError) as exc:
            await asyncio.to_thread(kill_group, proc.pid)
            out, err = await proc.communicate()
            if isinstance(exc, asyncio.CancelledError):
                raise
            return ExecResult(None, out.decode(errors="replace"), err.decode(errors="replace"), True)
        await asyncio.to_thread(kill_group, proc.pid, 0.2)  # background leftovers of a finished command
        return ExecResult(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> dict[str, Path]:
        """Launch in the background in its own process group; the exit status lands in meta/<name>.status."""
        files = {k: self.meta / f"{name}.{k}" for k in ("stdout", "stderr", "status")}
        script = (f"{shlex.join(argv)} >{shlex.quote(str(files['stdout']))} 2>{shlex.quote(str(files['stderr']))}"
                  f" </dev/null; echo $? >{shlex.quote(str(files['status']))}")
        self._procs[name] = subprocess.Popen(["/bin/sh", "-c", script], cwd=self.workdir, env=self.env(env),
                                             stdin=subprocess.DEVNULL, start_new_session=True)
        return files

    def kill(self, name: str) -> None:
        proc = self._procs.pop(name, None)
        if proc is not None:
            proc.poll()
            kill_group(proc.pid, leader=proc)
            proc.wait(timeout=5)

    def close(self) -> None:
        for name in list(self._procs):
            self.kill(name)
        if not self.own_workdir:
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            shutil.rmtree(self.home, ignore_errors=True)
            shutil.rmtree(self.meta, ignore_errors=True)
