"""The bubblewrap sandbox: what an RL policy issuing shell commands must not be able to get around.

- A new root with the system (/usr, /etc with secrets masked, /lib*), the Python prefixes, and the paths
  it is given (node, the agent tools) read-only; the workspace and home writable, bound at their host paths;
  a private, size-limited /tmp. No project checkout, run directory or cache; slimecli's package is masked.
- New user, pid, ipc, net, uts and cgroup namespaces: no host process, signal target or environment is
  visible, and the network is `lo` plus relays to the allowed ports (relay.py).
- As root, bwrap enters a user namespace made here that maps host uid 0 and the sandbox uid to themselves;
  the launcher (inner.py) drops to the sandbox uid before anything else runs. So sandboxed processes are an
  unprivileged host uid (the kernel never applies RLIMIT_NPROC to host root, and root would own every
  root-owned file it sees), while bwrap can still reach bind sources under private directories.
- Limits are set by the launcher inside the namespaces; the disk quota is the base class's watchdog.
"""

from __future__ import annotations

import functools
import io
import os
import select
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from slimecli.config.groups.sandbox import SandboxConfig
from slimecli.process import children
from slimecli.sandbox.base import INNER, Launch, Sandbox, base_python, launcher_spec
from slimecli.sandbox.relay import HostRelay

SYSTEM_RO = ("/usr", "/etc")
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")  # links into /usr on merged systems
ETC_SECRETS = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers",
               "/etc/security/opasswd", "/etc/ssh", "/etc/sudoers.d", "/etc/ssl/private")
INNER_DIR = "/run/slimecli"


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _make_userns(uid: int, timeout_s: float) -> int:
    """An fd of a new user namespace mapping 0 and `uid` to themselves (written by us, as root)."""
    helper = subprocess.Popen(["unshare", "--user", "--", "/bin/sh", "-c", "echo ready; exec cat"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert helper.stdin is not None and helper.stdout is not None and helper.stderr is not None  # all PIPEs
    try:
        ready, _, _ = select.select([helper.stdout], [], [], timeout_s)
        if not ready or not helper.stdout.readline():
            err = cast(io.BufferedReader, helper.stderr).read1(2000)  # a PIPE, so a buffered reader
            raise RuntimeError(f"cannot create a user namespace: {err.decode(errors='replace')}")
        for name in ("uid_map", "gid_map"):
            Path(f"/proc/{helper.pid}/{name}").write_text(f"0 0 1\n{uid} {uid} 1\n")
        return os.open(f"/proc/{helper.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        helper.stdin.close()
        helper.wait(timeout=timeout_s)
        for stream in (helper.stdout, helper.stderr):
            stream.close()


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.chown(root, uid, gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            try:
                os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)
            except FileNotFoundError:
                continue


class BwrapSandbox(Sandbox):
    kind = "bwrap"
    leaves_strays = False  # its pid namespace: when the namespace's init dies, the kernel kills everything inside

    @classmethod
    def unavailable(cls, settings: SandboxConfig, **options: Any) -> str | None:
        return available()

    def __init__(self, workdir: str | Path | None = None, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(workdir, **kwargs)
        self.binary = shutil.which("bwrap") or "bwrap"
        self.as_root = os.geteuid() == 0
        self.uid = self.settings.uid
        self._userns: int | None = None
        self._owner = (os.stat(self.workdir).st_uid, os.stat(self.workdir).st_gid)
        self.relay: HostRelay | None = None
        try:
            if self.as_root:
                self._userns = _make_userns(self.uid, self.settings.start_timeout_s)
                _chown_tree(self.workdir, self.uid, self.uid)
                _chown_tree(self.home, self.uid, self.uid)
            if self.allow_ports:
                relay_dir = self.root / "relay"
                relay_dir.mkdir(mode=0o755)
                self.relay = HostRelay(relay_dir, self.allow_ports)
        except BaseException:
            self.close()
            raise

    def limits(self) -> dict[str, int]:
        return {**super().limits(), "nproc": self.settings.max_processes}

    def _namespaces(self) -> list[str]:
        if self._userns is not None:
            return ["--userns", str(self._userns), "--unshare-pid", "--unshare-ipc", "--unshare-net", "--unshare-uts",
                    "--unshare-cgroup-try", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        return ["--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(self.uid), "--gid", str(self.uid),
                "--cap-drop", "ALL"]

    def _read_only(self) -> list[str]:
        import sys

        wanted = [sys.base_prefix, sys.prefix, *self.ro_paths]
        wanted += [d for d in self.path_dirs if d.startswith("/")]
        out: list[str] = []
        for p in sorted({os.path.realpath(p) for p in wanted if os.path.exists(p)}, key=len):
            if not _under(p, [*SYSTEM_RO, *out]):
                out.append(p)
        return out

    def _mounts(self) -> list[str]:
        args: list[str] = []
        for d in SYSTEM_RO:
            args += ["--ro-bind", d, d]
        for d in SYSTEM_LINKS:
            if os.path.islink(d):
                args += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                args += ["--ro-bind", d, d]
        for secret in ETC_SECRETS:
            if os.path.isdir(secret) and not os.path.islink(secret):
                args += ["--tmpfs", secret]
            elif os.path.exists(secret):
                args += ["--ro-bind", "/dev/null", secret]
        tmp = str(self.settings.tmp_mb << 20)
        args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", tmp, "--tmpfs", "/tmp",
                 "--perms", "1777", "--size", tmp, "--tmpfs", "/dev/shm"]
        made: list[str] = []

        def bind(option: str, src: str, dest: str) -> None:
            for parent in reversed(Path(dest).parents):
                p = str(parent)
                if p not in ("/", "/tmp") and p not in made and not _under(p, [*SYSTEM_RO, *ro]):
                    made.append(p)
                    args.extend(["--perms", "0755", "--dir", p])  # bwrap would make them 0700
            args.extend([option, src, dest])

        ro = self._read_only()
        for p in ro:
            bind("--ro-bind", p, p)
        import slimecli

        package = os.path.realpath(Path(slimecli.__file__).parent)  # task data: gold patches, hidden tests
        if _under(package, [*SYSTEM_RO, *ro]):
            args += ["--tmpfs", package]
        for path in (self.workdir, self.home):
            bind("--bind", str(path), str(path))
        if self.relay is not None:
            bind("--ro-bind", str(self.relay.directory), str(self.relay.directory))
        bind("--ro-bind", str(INNER), f"{INNER_DIR}/inner.py")
        return [*args, "--remount-ro", "/"]

    def _launch(self, argv: Sequence[str], env: dict[str, str], cwd: Path) -> Launch:
        relays = self.relay.targets() if self.relay is not None else []
        spec = launcher_spec(argv, env, cwd, self.limits(), self.uid if self._userns is not None else None, relays)
        args = [self.binary, *self._namespaces(), "--die-with-parent", "--new-session", "--hostname", "sandbox",
                "--clearenv", *self._mounts(), "--chdir", "/", "--",
                base_python(), "-I", "-S", f"{INNER_DIR}/inner.py", *spec]
        fds = (self._userns,) if self._userns is not None else ()
        return Launch(args, {"PATH": "/usr/bin:/bin"}, str(self.root), fds)

    def _roots(self, pid: int) -> list[int]:
        return children(pid)  # the namespace's init: when it dies the kernel kills everything inside

    def _adopt(self, path: Path) -> None:
        if self._userns is not None:
            os.chown(path, self.uid, self.uid, follow_symlinks=False)

    def _release(self) -> None:
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        if self._userns is not None:
            os.close(self._userns)
            self._userns = None
            if not self.own_workdir and self.workdir.exists():
                _chown_tree(self.workdir, *self._owner)  # the caller's directory goes back to its owner


@functools.cache
def available() -> str | None:
    """None when a bwrap sandbox starts here, else why not (`auto` then tries a container runtime: auto.py)."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed"
    try:
        sandbox = BwrapSandbox(settings=SandboxConfig(name="bwrap"))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return f"bwrap cannot start: {exc}"
    try:
        launch = sandbox._prepare(["/bin/true"], None, None)
        proc = subprocess.run(launch.argv, env=launch.env, cwd=launch.cwd, pass_fds=launch.pass_fds,
                              capture_output=True, text=True, timeout=sandbox.settings.start_timeout_s)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap cannot start: {exc}"
    finally:
        sandbox.close()
    if proc.returncode != 0:
        return f"bwrap cannot create its namespaces here: {proc.stderr.strip()[-300:]}"
    return None
