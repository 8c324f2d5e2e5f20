"""The container sandbox's `run` command, without a runtime: the OCI runtime flag, limits at or below the
caller's hard limits, no host system directory over the image's, and closed directories (/root) made passable."""

from __future__ import annotations

import os
import resource
import sys

from slimecli.config.groups.sandbox import SandboxConfig
from slimecli.sandbox.container import ULIMIT_CAPS, ContainerSandbox


def argv_of(tmp_path, **kwargs) -> list[str]:
    ws = tmp_path / "ws"
    ws.mkdir()
    settings = SandboxConfig(name="podman", binary="/nonexistent/podman", container_runtime="runc")
    box = ContainerSandbox(ws, runtime="podman", image="localhost/img", settings=settings, **kwargs)
    try:
        return box.run_argv(["true"], box.env(), ws, "n1")
    finally:
        box._release = lambda: None  # no runtime to ask
        box.close()


def test_runtime_flag_and_limits_at_or_below_the_hard_limits(tmp_path):
    argv = argv_of(tmp_path)
    assert argv[argv.index("--runtime") + 1] == "runc"
    limits = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--ulimit")
    for name, which in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        soft, hard = map(int, limits[name].split(":"))
        real_hard = resource.getrlimit(which)[1]
        assert soft == hard <= ULIMIT_CAPS[name]
        assert real_hard == resource.RLIM_INFINITY or hard <= real_hard


def test_host_system_directories_are_never_mounted_over_the_image(tmp_path):
    tool = tmp_path / "tools"
    tool.mkdir()
    argv = argv_of(tmp_path, ro_paths=["/usr", "/etc", str(tool)], path_dirs=["/usr/bin"])
    mounts = [argv[i + 1] for i, a in enumerate(argv) if a == "-v"]
    assert f"{tool}:{tool}:ro" in mounts
    assert not [m for m in mounts if m.split(":")[1].split("/")[1] in ("usr", "etc", "lib", "bin")]
    if not os.path.realpath(sys.base_prefix).startswith("/usr/"):
        assert any(m.startswith(os.path.realpath(sys.base_prefix) + ":") for m in mounts)


def test_a_closed_top_level_directory_is_replaced_by_its_mount_points(tmp_path):
    closed = tmp_path / "closed"  # stands for /root: a directory the sandbox user cannot enter
    (closed / "tools").mkdir(parents=True)
    closed.chmod(0o700)
    argv = argv_of(tmp_path, ro_paths=[str(closed / "tools")])
    mounts = [argv[i + 1] for i, a in enumerate(argv) if a == "-v"]
    top = "/" + tmp_path.parts[1]  # the top-level directory holding it
    if os.stat(top).st_mode & 0o001:  # open to others (as /tmp is): nothing to replace
        assert not [m for m in mounts if m.endswith(f":{top}:ro")]
        return
    [shadow] = [m for m in mounts if m.endswith(f":{top}:ro")]
    assert mounts.index(shadow) < mounts.index(f"{closed / 'tools'}:{closed / 'tools'}:ro")
    assert os.stat(shadow.split(":")[0]).st_mode & 0o777 == 0o755


def test_the_interpreter_under_a_closed_home_is_reachable(tmp_path):
    prefix = os.path.realpath(sys.base_prefix)
    top = "/" + prefix.split("/")[1]
    if prefix.startswith("/usr/") or os.stat(top).st_mode & 0o001:
        return  # the interpreter is the image's, or its directory is open: nothing to replace
    argv = argv_of(tmp_path)
    mounts = [argv[i + 1] for i, a in enumerate(argv) if a == "-v"]
    [shadow] = [m for m in mounts if m.endswith(f":{top}:ro")]
    assert mounts.index(shadow) < mounts.index(f"{prefix}:{prefix}:ro")
