"""docker / podman: each command is a `run` of the task image with the workspace, home, the agent tools and
node bind-mounted (not uploaded) at their host paths, no network but the relay, limits as flags.

The launcher (inner.py) runs with the host's base interpreter, bound read-only, so the image needs no Python
of its own; it must be able to run that interpreter (a glibc image, not Alpine). No host system directory
(/usr, /lib, /etc, ...) is mounted over the image's: an interpreter or a node under /usr on the host must be
in the image too (at the same path). Host paths are mounted at
their own paths; where a top-level directory of the image is closed to the sandbox user (/root), it is
replaced by a directory holding only the mount points, so those paths are reachable and nothing else is.
Resource limits are explicit `--ulimit`s at or below this process's hard limits, as a runtime without
CAP_SYS_RESOURCE cannot raise them.
"""

from __future__ import annotations

import os
import resource
import secrets
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slimecli.config.groups.sandbox import SandboxConfig
from slimecli.sandbox.base import INNER, Launch, Sandbox, base_python, launcher_spec
from slimecli.sandbox.relay import HostRelay

INNER_PATH = "/run/slimecli/inner.py"


def runtime_missing(runtime: str, binary: str | None = None) -> str | None:
    """None when the client and its daemon answer, else why not."""
    found = shutil.which(binary or runtime)
    if found is None:
        return f"{binary or runtime} is not installed"
    try:
        field = "{{.Host.Arch}}" if runtime == "podman" else "{{.ID}}"  # podman's info has no ID
        proc = subprocess.run([found, "info", "--format", field], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{runtime} does not answer: {exc}"
    if proc.returncode != 0:
        return f"{runtime} daemon not reachable: {proc.stderr.strip()[-300:]}"
    return None


def image_missing(runtime: str, image: str, binary: str | None = None) -> str | None:
    """None when `image` is among the runtime's local images or can be pulled now, else why not: a run must not
    find out at its first sandbox."""
    found = shutil.which(binary or runtime) or binary or runtime
    try:
        if subprocess.run([found, "image", "inspect", image], capture_output=True, timeout=60).returncode == 0:
            return None
        pull = subprocess.run([found, "pull", "-q", image], capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{runtime} cannot look for the image {image}: {exc}"
    if pull.returncode == 0:
        return None
    last = (pull.stderr.strip().splitlines() or [f"exit {pull.returncode}"])[-1]
    return f"the image {image} is not among {runtime}'s local images and cannot be pulled: {last[-300:]}"


class ContainerSandbox(Sandbox):
    kind = "docker"
    runs_images = True

    @classmethod
    def unavailable(cls, settings: SandboxConfig, *, runtime: str = "docker", **options: Any) -> str | None:
        return runtime_missing(runtime, settings.binary)

    def __init__(self, workdir: str | Path | None = None, *, runtime: str = "docker", image: str,
                 **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(workdir, **kwargs)
        self.kind = runtime  # type: ignore[misc]
        self.binary = self.settings.binary or shutil.which(runtime) or runtime
        self.image = image
        self.label = f"slimecli-{secrets.token_hex(6)}"
        self._names: dict[int, str] = {}
        self._next: str | None = None
        self.relay: HostRelay | None = None
        self.uid = os.getuid() or self.settings.uid
        self._owner = (os.stat(self.workdir).st_uid, os.stat(self.workdir).st_gid)
        if self.uid != os.getuid():  # as root: the sandbox user owns its workspace and home while it runs
            _chown_tree(self.workdir, self.uid)
            _chown_tree(self.home, self.uid)
        if self.allow_ports:
            (self.root / "relay").mkdir(mode=0o755)
            self.relay = HostRelay(self.root / "relay", self.allow_ports)

    def run_argv(self, argv: Sequence[str], env: dict[str, str], cwd: Path, name: str) -> list[str]:
        s = self.settings
        uid = self.uid
        args = [self.binary, "run", "--rm", "--init", "--name", name, "--label", f"slimecli.sandbox={self.label}",
                *(["--runtime", s.container_runtime] if s.container_runtime else []),
                "--network", "none", "--hostname", "sandbox", "--user", f"{uid}:{uid}", "--cap-drop", "ALL",
                "--security-opt", "no-new-privileges", "--pids-limit", str(s.max_processes),
                "--memory", f"{s.memory_mb}m", *_ulimits(s.max_file_mb << 20),
                "--read-only", "--tmpfs", f"/tmp:size={s.tmp_mb}m", "--workdir", "/"]
        prefixes = {os.path.realpath(p) for p in (sys.base_prefix, *self.ro_paths) if os.path.exists(p)}
        prefixes |= {os.path.realpath(d) for d in self.path_dirs if d.startswith("/") and os.path.isdir(d)}
        prefixes = {p for p in prefixes if not _system(p)}  # the image's own system, never the host's
        args += self._shadows([str(self.workdir), str(self.home), *prefixes])
        for path in (self.workdir, self.home):
            args += ["-v", f"{path}:{path}:rw"]
        for prefix in sorted(prefixes):
            args += ["-v", f"{prefix}:{prefix}:ro"]
        args += ["-v", f"{INNER}:{INNER_PATH}:ro"]
        if self.relay is not None:
            args += ["-v", f"{self.relay.directory}:{self.relay.directory}:ro"]
        relays = self.relay.targets() if self.relay is not None else []
        spec = launcher_spec(argv, env, cwd, {}, None, relays)
        return [*args, self.image, base_python(), "-I", "-S", INNER_PATH, *spec]

    def _shadows(self, destinations: list[str]) -> list[str]:
        """Mounts replacing each closed top-level directory (/root) by one holding only the mount points."""
        args: list[str] = []
        for top in sorted({Path(d).parts[1] for d in destinations if len(Path(d).parts) > 2}):
            host = Path("/", top)
            if not host.is_dir() or host.stat().st_mode & 0o001 or top == "tmp":
                continue
            shadow = self.root / "shadow" / top
            for d in destinations:
                if Path(d).parts[1] == top:
                    (shadow / Path(d).relative_to(host)).mkdir(mode=0o755, parents=True, exist_ok=True)
            for made in [shadow, *(p for p in shadow.rglob("*") if p.is_dir())]:
                made.chmod(0o755)
            args += ["-v", f"{shadow}:/{top}:ro"]
        return args

    def _adopt(self, path: Path) -> None:
        if self.uid != os.getuid():
            os.chown(path, self.uid, self.uid, follow_symlinks=False)

    def _launch(self, argv: Sequence[str], env: dict[str, str], cwd: Path) -> Launch:
        name = f"{self.label}-{secrets.token_hex(4)}"
        self._next = name
        return Launch(self.run_argv(argv, env, cwd, name), {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                      str(self.root))

    def _kill_tree(self, pid: int, grace_s: float = 1.0, leader: subprocess.Popen | None = None) -> None:
        """The client dying does not stop its container: remove the container itself."""
        name = self._names.pop(pid, None) or self._next
        if name is not None:
            subprocess.run([self.binary, "rm", "-f", name], capture_output=True, timeout=60)
        super()._kill_tree(pid, grace_s, leader)

    def _spawned(self, pid: int) -> None:
        if self._next is not None:
            self._names[pid] = self._next
            self._next = None

    def _release(self) -> None:
        found = subprocess.run([self.binary, "ps", "-aq", "--filter", f"label=slimecli.sandbox={self.label}"],
                               capture_output=True, text=True, timeout=60)
        ids = found.stdout.split()
        if ids:
            subprocess.run([self.binary, "rm", "-f", *ids], capture_output=True, timeout=60)
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        if self.uid != os.getuid() and not self.own_workdir and self.workdir.exists():
            _chown_tree(self.workdir, *self._owner)  # the caller's directory goes back to its owner


# Host paths never mounted over the image: its system is its own (node or a python under /usr come from the image).
IMAGE_SYSTEM = frozenset({"", "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "var", "proc", "sys",
                          "dev", "run", "boot"})


def _system(path: str) -> bool:
    return path == "/" or path.split("/")[1] in IMAGE_SYSTEM


# Caps on the explicit limits: the runtime's own process may hold lower ones than this one (podman: nproc 32768).
ULIMIT_CAPS = {"nofile": 65536, "nproc": 16384}


def _ulimits(fsize: int) -> list[str]:
    """Open files and processes at most at this process's hard limits (never above them), and the file size."""
    out = ["--ulimit", f"fsize={fsize}"]
    for name, limit in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        hard = resource.getrlimit(limit)[1]
        value = ULIMIT_CAPS[name] if hard == resource.RLIM_INFINITY else min(hard, ULIMIT_CAPS[name])
        out += ["--ulimit", f"{name}={value}:{value}"]
    return out


def _chown_tree(root: Path, uid: int, gid: int | None = None) -> None:
    gid = uid if gid is None else gid
    for dirpath, dirnames, filenames in os.walk(root):
        os.chown(dirpath, uid, gid, follow_symlinks=False)
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            try:
                os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)
            except FileNotFoundError:
                continue
