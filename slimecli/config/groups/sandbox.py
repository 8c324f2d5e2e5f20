from __future__ import annotations

from dataclasses import dataclass

from slimecli.config.decode import spec


@dataclass(frozen=True)
class SandboxConfig:
    """Where agent commands and graders run, and the limits they run under (see slimecli.sandbox)."""

    name: str = "auto"  # auto (bwrap where it starts, else local) | bwrap | local | docker | podman
    max_processes: int = 256  # processes and threads of one sandboxed command tree (fork bombs)
    max_file_mb: int = 1024  # the largest file a sandboxed process may write
    memory_mb: int = 4096  # data segment of each process (RLIMIT_DATA; node's huge PROT_NONE reservations are free)
    disk_mb: int = 4096  # how much the workspace and home may grow; past it every command is killed
    tmp_mb: int = 1024  # private /tmp (and /dev/shm) size
    uid: int = 65534  # the unprivileged uid of sandboxed processes (also on the host when slimecli runs as root)
    extra_ro_paths: tuple[str, ...] = ()  # more host paths visible read-only (e.g. a toolchain outside /usr)
    image: str = "python:3.11-slim"  # docker/podman: the image of tasks that name none
    binary: str | None = None  # docker/podman: the client binary (default: found on PATH)
    # docker/podman: the OCI runtime (`--runtime`), e.g. runc where the default crun cannot run (hybrid cgroups)
    container_runtime: str | None = None
    max_concurrent_boots: int = 16  # agent runs whose sandbox is being created and set up at the same time
    # how long a sandbox may take to start (probe, image pull excluded)
    start_timeout_s: float = spec(30.0, resumable=True)
