from __future__ import annotations

from dataclasses import dataclass

from slimecli.config.decode import spec

# What sandbox=local leaves open (docs/sandboxes.md): said when a run that chose it starts, and in its summary.
LOCAL_GAPS = ("the agent's commands can read and write every file this user can (run directories, checkpoints, "
              "caches, the project, the grader's data), reach every loopback port (the engine's admin routes, the "
              "teacher, the reward server), signal this user's processes and read their environments, and leave "
              "processes behind; sandbox.disk_mb counts only its workspace, home and TMPDIR")


@dataclass(frozen=True)
class SandboxConfig:
    """Where agent commands and graders run, and the limits they run under (see slimecli.sandbox)."""

    # auto (bwrap where it starts, else podman or docker with the image local, else refused) | bwrap | local | docker
    # | podman; local isolates nothing and is taken only when named
    name: str = "auto"
    # processes and threads of one sandboxed command tree (fork bombs); local: of the whole sandbox, where a pids
    # cgroup can be made (as root), else the run says it does not apply
    max_processes: int = spec(256, gt=0)
    max_file_mb: int = spec(1024, gt=0)  # the largest file a sandboxed process may write
    memory_mb: int = spec(4096, gt=0)  # data segment of each process (RLIMIT_DATA; node's huge PROT_NONE reservations are free)
    # how much the workspace and home (local: and its TMPDIR) may grow; past it every command is killed
    disk_mb: int = spec(4096, gt=0)
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
