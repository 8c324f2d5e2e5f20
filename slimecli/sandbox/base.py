"""The sandbox contract: exec / start / poll / output / kill / read_file / write_file / diff / close.

Every kind says how one command enters the sandbox (`_launch`) and which host processes must die for
its whole tree to be gone (`_roots`). Everything else is shared: a scrubbed environment, time limits,
the disk quota, background commands whose output lands in host files the sandbox cannot see, and the
diff, which runs inside the sandbox because the agent controls the repository's git configuration.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar

from slimecli.config.groups.sandbox import SandboxConfig
from slimecli.process import exit_status, kill_group, wait_gone
from slimecli.sandbox import strays
from slimecli.sandbox.pipes import DRAIN_S, Pipes
from slimecli.sandbox.quota import DiskQuota

KEEP_ENV = ("LANG", "LC_ALL", "TZ")
SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin")
INNER = Path(__file__).with_name("inner.py")
# Neither the repository's config nor the user's may run anything here (fsmonitor, hooks, external diff).
GIT_SAFE = ("-c", "core.fsmonitor=", "-c", "core.hooksPath=/dev/null", "-c", "diff.external=", "-c", "core.pager=cat",
            "-c", "safe.directory=*")
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_TERMINAL_PROMPT": "0"}


@dataclass
class ExecResult:
    returncode: int | None  # None when killed (time limit or disk quota)
    stdout: str
    stderr: str
    timed_out: bool = False
    killed_for: str | None = None  # "timeout" | "disk"


@dataclass
class Launch:
    """How the host starts one command of the sandbox."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    pass_fds: tuple[int, ...] = ()


@dataclass
class _Job:
    proc: subprocess.Popen
    files: tuple[Path, Path]
    handles: list[IO[bytes]] = field(default_factory=list)


def launcher_spec(argv: Sequence[str], env: dict[str, str], cwd: str | Path, limits: dict[str, int],
                  drop: int | None = None, relays: Sequence[tuple[int, str]] = (),
                  cgroup: str | Path | None = None) -> list[str]:
    """The launcher's arguments (inner.py parses them): flags with one value each, then `--` and the command."""
    args = [f for name, value in limits.items() for f in ("--limit", f"{name}={value}")]
    args += ["--drop", str(drop)] if drop is not None else []
    args += ["--cgroup", str(cgroup)] if cgroup is not None else []
    args += [f for port, path in relays for f in ("--relay", f"{port}={path}")]
    args += ["--cwd", str(cwd), *(f for item in env.items() for f in ("--env", "=".join(item)))]
    return [*args, "--", *argv]


def base_python() -> str:
    """The real interpreter behind this one (a venv's python is a link to it); runs the launcher."""
    return os.path.realpath(sys.executable)


class Sandbox(ABC):
    kind: ClassVar[str] = "base"
    tmpdir: ClassVar[str | None] = "/tmp"  # TMPDIR inside; None: a private directory of the host
    leaves_strays: ClassVar[bool] = True  # whether a process may outlive its command's kill (no pid namespace)
    runs_images: ClassVar[bool] = False  # takes `image=` (a container image the commands run in)

    @classmethod
    def unavailable(cls, settings: SandboxConfig, **options: Any) -> str | None:
        """Why this kind cannot run on this machine (None: it can); options are its registry entry's."""
        return None

    def __init__(self, workdir: str | Path | None = None, *, allow_ports: Sequence[int] = (),
                 settings: SandboxConfig | None = None, ro_paths: Sequence[str | Path] = (),
                 path_dirs: Sequence[str] = ()) -> None:
        self.settings = settings or SandboxConfig(name=self.kind)
        self.root = Path(tempfile.mkdtemp(prefix="slimecli-sandbox-")).resolve()
        self.own_workdir = workdir is None
        self.workdir = Path(workdir).resolve() if workdir is not None else self.root / "workspace"
        self.home = self.root / "home"
        self.meta = self.root / "meta"  # outputs of background commands: host side only
        for d in (self.workdir, self.home, self.meta):
            d.mkdir(parents=True, exist_ok=True)
        self.meta.chmod(0o700)
        self.allow_ports = tuple(int(p) for p in allow_ports)
        self.ro_paths = [str(p) for p in (*ro_paths, *self.settings.extra_ro_paths)]
        self.path_dirs = [*path_dirs, *SYSTEM_PATH]
        self.violation: str | None = None  # why every command was killed ("disk"), once it happened
        self._jobs: dict[str, _Job] = {}
        self._running: dict[int, object] = {}  # pid -> exec() process
        self._lock = threading.Lock()
        self._closed = False
        self.quota = DiskQuota(self._quota_roots(), self.settings.disk_mb << 20, self._disk_exceeded)

    # --- what each kind provides -------------------------------------------------------------------
    @abstractmethod
    def _launch(self, argv: Sequence[str], env: dict[str, str], cwd: Path) -> Launch:
        """The host command that runs `argv` inside the sandbox."""

    def _roots(self, pid: int) -> list[int]:
        """Host pids whose death takes the whole tree of the command started as `pid` with it."""
        return []

    def _spawned(self, pid: int) -> None:
        """The host process of the command last launched is `pid`."""
        return None

    def _adopt(self, path: Path) -> None:
        """Give what the host wrote to the sandbox's user (where that user is not the caller)."""
        return None

    def _release(self) -> None:
        """Anything else the kind holds (relays, namespaces, ownership)."""
        return None

    def _quota_roots(self) -> tuple[Path, ...]:
        """What `disk_mb` counts: the workspace and home (plus, where the kind has one, its private TMPDIR)."""
        return (self.workdir, self.home)

    def limits(self) -> dict[str, int]:
        s = self.settings
        return {"fsize": s.max_file_mb << 20, "data": s.memory_mb << 20}

    # --- environment and files -----------------------------------------------------------------------
    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """Nothing of the caller's environment leaks in (no API keys, no proxies) except locale settings."""
        env = {k: os.environ[k] for k in KEEP_ENV if k in os.environ}
        env.update({"PATH": os.pathsep.join(dict.fromkeys(self.path_dirs)), "HOME": str(self.home),
                    "TMPDIR": self.tmpdir or str(self.root / "tmp"), "TERM": "dumb", "NO_COLOR": "1", "CI": "1"})
        env.setdefault("LANG", "C.UTF-8")
        env.update(extra or {})
        return env

    def _inside(self, path: str | Path) -> Path:
        p = Path(path)
        p = p if p.is_absolute() else self.workdir / p
        p = Path(os.path.normpath(p))
        if not any(p == r or r in p.parents for r in (self.workdir, self.home)):
            raise ValueError(f"{path}: outside the sandbox's workspace and home")
        return p

    def _contained(self, p: Path) -> bool:
        """After links: still inside (a link the agent planted must not lead the host elsewhere)."""
        real = p.resolve()
        return any(real == r or r in real.parents for r in (self.workdir, self.home))

    def write_file(self, path: str | Path, content: str | bytes) -> Path:
        p = self._inside(path)
        missing = [d for d in (p.parent, *p.parent.parents) if not d.exists()]
        p.parent.mkdir(parents=True, exist_ok=True)
        if not self._contained(p.parent):
            raise ValueError(f"{path}: a link leads outside the sandbox")
        data = content.encode() if isinstance(content, str) else content
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        for d in (p, *missing):
            self._adopt(d)
        return p

    def read_file(self, path: str | Path) -> str | None:
        p = self._inside(path)
        if not self._contained(p):
            return None
        try:
            return p.read_text(errors="replace")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    # --- commands --------------------------------------------------------------------------------------
    def _prepare(self, argv: Sequence[str], env: dict[str, str] | None, cwd: str | Path | None) -> Launch:
        if self._closed:
            raise RuntimeError("the sandbox is closed")
        if not argv:
            raise ValueError("empty command")
        self.quota.start()
        return self._launch(list(argv), self.env(env), Path(cwd) if cwd else self.workdir)

    async def exec(self, argv: Sequence[str], timeout_s: float, env: dict[str, str] | None = None,
                   cwd: str | Path | None = None) -> ExecResult:
        """Run to completion, or kill the whole tree at the time limit (or when the disk quota is spent).

        The limit covers the output too: a child that detached from the command's process group and keeps
        its stdout open is killed at the limit (it holds the command's pipe), and whatever was read is kept.
        """
        if self.violation:
            return ExecResult(None, "", f"sandbox: killed ({self.violation} limit)\n", killed_for=self.violation)
        launch = self._prepare(argv, env, cwd)
        pipes = Pipes()
        try:
            proc = await asyncio.create_subprocess_exec(
                *launch.argv, cwd=launch.cwd, env=launch.env, stdin=subprocess.DEVNULL, stdout=pipes.write_ends[0],
                stderr=pipes.write_ends[1], start_new_session=True, pass_fds=launch.pass_fds)
        except BaseException:
            pipes.close()
            raise
        pipes.started()
        self._running[proc.pid] = proc
        self._spawned(proc.pid)
        waiter: asyncio.Future[object] = asyncio.ensure_future(proc.wait())
        over = False
        try:
            readers = await pipes.readers()
            _, pending = await asyncio.wait([waiter, *readers], timeout=timeout_s)
            over = bool(pending)
            if over:  # over the limit: the command, its group, then whatever still holds its pipes
                await asyncio.to_thread(self._kill_tree, proc.pid)
                await asyncio.to_thread(strays.kill_holders, pipes.inodes)
                await asyncio.wait(pending, timeout=DRAIN_S)
        except asyncio.CancelledError:
            await asyncio.to_thread(self._kill_tree, proc.pid)
            await asyncio.to_thread(strays.kill_holders, pipes.inodes)
            raise
        finally:
            self._running.pop(proc.pid, None)
            pipes.close()
            if not waiter.done():
                waiter.cancel()
        if not over:
            await asyncio.to_thread(self._kill_tree, proc.pid, 0.2)  # leftovers where there is no namespace
        text_out, text_err = pipes.text()
        if over:
            return ExecResult(None, text_out, text_err, True, "timeout")
        if self.violation:
            return ExecResult(None, text_out, text_err, killed_for=self.violation)
        return ExecResult(exit_status(proc.returncode or 0), text_out, text_err)

    def start(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        """Launch in the background; stdout/stderr go to host files outside the sandbox (meta/)."""
        if self.violation:
            raise RuntimeError(f"sandbox killed ({self.violation} limit)")
        self.kill(name)
        launch = self._prepare(argv, env, None)
        files = (self.meta / f"{name}.stdout", self.meta / f"{name}.stderr")
        handles: list[IO[bytes]] = [f.open("wb") for f in files]
        # Started from the calling thread: bwrap's --die-with-parent follows the thread that forked it.
        proc = subprocess.Popen(launch.argv, cwd=launch.cwd, env=launch.env, stdin=subprocess.DEVNULL,
                                stdout=handles[0], stderr=handles[1], start_new_session=True,
                                pass_fds=launch.pass_fds)
        self._jobs[name] = _Job(proc, files, handles)
        self._spawned(proc.pid)

    def poll(self, name: str) -> int | None:
        job = self._jobs.get(name)
        if job is None:
            raise KeyError(f"no background command {name!r}")
        code = job.proc.poll()
        return None if code is None else exit_status(code)

    def output(self, name: str) -> tuple[str, str]:
        job = self._jobs.get(name)
        if job is None:
            return "", ""
        out, err = (f.read_text(errors="replace") if f.exists() else "" for f in job.files)
        return out, err

    def kill(self, name: str) -> None:
        """Kill the command and everything it started; its output stays readable."""
        job = self._jobs.get(name)
        if job is None:
            return
        self._kill_tree(job.proc.pid, leader=job.proc)
        try:
            job.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            job.proc.kill()
            job.proc.wait(timeout=10)
        for h in job.handles:
            h.close()
        job.handles.clear()

    def _kill_tree(self, pid: int, grace_s: float = 1.0, leader: subprocess.Popen | None = None) -> None:
        roots = self._roots(pid)
        for root in roots:
            try:
                os.kill(root, signal.SIGKILL)
            except ProcessLookupError:
                continue
        kill_group(pid, grace_s=0.0 if roots else grace_s, leader=leader)
        wait_gone(roots, timeout_s=10)

    def _disk_exceeded(self) -> None:
        """The quota thread found workspace + home over the limit: every command of the sandbox dies."""
        self.violation = "disk"
        for pid in list(self._running):
            self._kill_tree(pid, 0.0)
        for job in list(self._jobs.values()):
            if job.proc.poll() is None:
                self._kill_tree(job.proc.pid, 0.0, leader=job.proc)

    # --- the agent's change ----------------------------------------------------------------------------
    async def diff(self, exclude: Sequence[str] = (), timeout_s: float = 60.0) -> str:
        """`git diff HEAD` of the workspace with untracked files, computed INSIDE the sandbox: the agent
        controls .git/config (fsmonitor, external diff, hooks), so host git must never run on it."""
        specs = shlex.join([".", *(f":(exclude){e}" for e in exclude)])
        script = (f'git "$@" add -N -- {specs} && '
                  f'git "$@" diff --binary --no-ext-diff --no-textconv --no-color HEAD -- {specs}')
        result = await self.exec(["/bin/sh", "-c", script, "sh", *GIT_SAFE], timeout_s, env=GIT_ENV)
        if result.timed_out:
            raise TimeoutError(f"git diff took over {timeout_s}s")
        if result.returncode != 0:
            why = result.killed_for or f"exit {result.returncode}"
            raise RuntimeError(f"git diff failed ({why}): {result.stderr.strip()[-500:]}")
        return result.stdout

    # --- the end -----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Kill everything (nothing stays running) and remove what the sandbox created."""
        if self._closed:
            return
        self._closed = True
        self.quota.stop()
        for name in list(self._jobs):
            self.kill(name)
        for pid in list(self._running):
            self._kill_tree(pid, 0.0)
        self._release()
        strays.remove_root(self.root, strays=self.leaves_strays)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
