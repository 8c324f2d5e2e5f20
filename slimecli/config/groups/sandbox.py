from __future__ import annotations

from dataclasses import dataclass

from slimecli.config.decode import spec


@dataclass(frozen=True)
class SandboxConfig:
    """Where agent commands and graders run, and the limits they run under (see slimecli.sandbox)."""

    name: str = "auto"  # auto (bwrap where it starts, else local) | bwrap | local | docker | podman
    max_processes: int = spec(256, gt=0)  # processes and threads of one sandboxed command tree (fork bombs)
    max_file_mb: int = spec(1024, gt=0)  # the largest file a sandboxed process may write
    memory_mb: int = spec(4096, gt=0)  # data segment of each process (RLIMIT_DATA; node's huge PROT_NONE reservations are free)
    disk_mb: int = spec(4096, gt=0)  # how much the workspace and home may grow; past it every command is killed
    tmp_mb: int = spec(1024, gt=0)  # private /tmp (and /dev/shm) size
    uid: int = spec(65534, gt=0, note="an unprivileged uid; 65534, nobody, works everywhere")  # the unprivileged uid of sandboxed processes (also on the host when slimecli runs as root)
    extra_ro_paths: tuple[str, ...] = ()  # more host paths visible read-only (e.g. a toolchain outside /usr)
    image: str = "python:3.11-slim"  # docker/podman: the image of tasks that name none
    binary: str | None = None  # docker/podman: the client binary (default: found on PATH)
    # docker/podman: the OCI runtime (`--runtime`), e.g. runc where the default crun cannot run (hybrid cgroups)
    container_runtime: str | None = None
    max_concurrent_boots: int = spec(16, gt=0)  # agent runs whose sandbox is being created and set up at the same time
    # how long a sandbox may take to start (probe, image pull excluded)
    start_timeout_s: float = spec(30.0, gt=0, resumable=True)
