"""docker / podman: each command is a `run` of the task image with the workspace, home, the agent tools and
node bind-mounted (not uploaded) at their host paths, no network but the relay, limits as flags.

The launcher (inner.py) runs with the host's base interpreter, bound read-only, so the image needs no Python
of its own; it must be able to run that interpreter (a glibc image, not Alpine).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from slimecli.sandbox.base import INNER, Launch, Sandbox, base_python, launcher_spec
from slimecli.sandbox.relay import HostRelay

INNER_PATH = "/run/slimecli/inner.py"


def runtime_missing(runtime: str, binary: str | None = None) -> str | None:
    """None when the client and its daemon answer, else why not."""
    found = shutil.which(binary or runtime)
    if found is None:
        return f"{binary or runtime} is not installed"
    try:
        proc = subprocess.run([found, "info", "--format", "{{.ID}}"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{runtime} does not answer: {exc}"
    if proc.returncode != 0:
        return f"{runtime} daemon not reachable: {proc.stderr.strip()[-300:]}"
    return None


class ContainerSandbox(Sandbox):
    kind = "docker"

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
        if self.allow_ports:
            (self.root / "relay").mkdir(mode=0o755)
            self.relay = HostRelay(self.root / "relay", self.allow_ports)

    def run_argv(self, argv: Sequence[str], env: dict[str, str], cwd: Path, name: str) -> list[str]:
        s = self.settings
        uid = os.getuid() or s.uid
        args = [self.binary, "run", "--rm", "--init", "--name", name, "--label", f"slimecli.sandbox={self.label}",
                "--network", "none", "--hostname", "sandbox", "--user", f"{uid}:{uid}", "--cap-drop", "ALL",
                "--security-opt", "no-new-privileges", "--pids-limit", str(s.max_processes),
                "--memory", f"{s.memory_mb}m", "--ulimit", f"fsize={s.max_file_mb << 20}",
                "--read-only", "--tmpfs", f"/tmp:size={s.tmp_mb}m", "--workdir", "/"]
        for path in (self.workdir, self.home):
            args += ["-v", f"{path}:{path}:rw"]
        prefixes = {os.path.realpath(p) for p in (sys.base_prefix, *self.ro_paths) if os.path.exists(p)}
        for prefix in sorted(prefixes):
            args += ["-v", f"{prefix}:{prefix}:ro"]
        args += ["-v", f"{INNER}:{INNER_PATH}:ro"]
        if self.relay is not None:
            args += ["-v", f"{self.relay.directory}:{self.relay.directory}:ro"]
        relays = self.relay.targets() if self.relay is not None else []
        spec = launcher_spec(argv, env, cwd, {}, None, relays)
        return [*args, self.image, base_python(), "-I", "-S", INNER_PATH, spec]

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
