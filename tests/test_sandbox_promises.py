"""The sandbox's own promises under a command built to break them, for every kind: exec returns at its time
limit even when a detached child keeps stdout open (with the output read so far), and close() removes the
root it created even when a stray keeps writing into it or a directory was made read-only.

local and bwrap run for real (bwrap skipped where it cannot start); docker/podman go through the same code
with a stand-in client that runs the command on the host, as a container client would keep its pipes.
"""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from pathlib import Path

import pytest

from slimecli.config.groups.sandbox import SandboxConfig
from slimecli.sandbox import strays
from slimecli.sandbox.container import ContainerSandbox
from slimecli.sandbox.factory import make_sandbox
from tests.helpers import wait_until

BIN = str(Path(sys.executable).parent)
DETACH = "setsid sh -c 'sleep 300' </dev/null & echo started; sleep 0.1; echo more >&2"


def _bwrap_missing() -> str | None:
    from slimecli.sandbox.bwrap import available

    return available()


FAKE_CLIENT = """#!/bin/sh
# a container client stand-in: `run ... IMAGE python -I -S INNER SPEC` runs SPEC's command on the host
case "$1" in
  run) shift; while [ "$#" -gt 0 ] && [ "$1" != "IMAGE" ]; do shift; done; shift
       exec "$@" ;;
  *) exit 0 ;;
esac
"""


class FakeContainer(ContainerSandbox):
    """The container code path (names, `rm -f` at the limit, `_release`) with the launcher run on the host."""

    def run_argv(self, argv, env, cwd, name):  # type: ignore[no-untyped-def]
        from slimecli.sandbox.base import base_python, launcher_spec

        inner = str(Path(strays.__file__).with_name("inner.py"))
        return [self.binary, "run", "--name", name, "IMAGE", base_python(), "-I", "-S", inner,
                *launcher_spec(argv, env, cwd, {})]


def make(kind: str, tmp_path: Path, workdir: Path | None):
    if kind in ("docker", "podman"):
        client = tmp_path / f"fake-{kind}"
        client.write_text(FAKE_CLIENT)
        client.chmod(0o755)
        return FakeContainer(workdir, runtime=kind, image="IMAGE", path_dirs=[BIN],
                             settings=SandboxConfig(name=kind, binary=str(client)))
    return make_sandbox(SandboxConfig(name=kind), workdir, path_dirs=[BIN])


KINDS = [pytest.param("local"),
         pytest.param("bwrap", marks=pytest.mark.skipif(_bwrap_missing() is not None,
                                                        reason=f"bwrap cannot start here: {_bwrap_missing()}")),
         pytest.param("docker"), pytest.param("podman")]


@pytest.fixture(params=KINDS)
def kind(request):
    return request.param


def sh(sandbox, script: str, timeout: float):
    # the outer bound only keeps a broken exec from hanging the suite; the promise is exec's own limit
    return asyncio.run(asyncio.wait_for(sandbox.exec(["/bin/sh", "-c", script], timeout_s=timeout), 120))


def test_a_detached_child_holding_stdout_does_not_outlast_the_time_limit(kind, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    box = make(kind, tmp_path, ws)
    try:
        res = sh(box, DETACH, timeout=2)
        if not res.timed_out:  # a pid namespace took the detached child with the command
            assert kind == "bwrap" and res.returncode == 0
        else:
            assert res.returncode is None and res.killed_for == "timeout"
        assert res.stdout == "started\n" and res.stderr.endswith("more\n")  # read before the kill: kept
        assert strays.holders(root=box.root) == [] or kind == "bwrap"
        assert sh(box, "echo still usable", timeout=30).stdout == "still usable\n"
    finally:
        box.close()
    assert strays.holders(root=box.root) == []


def test_close_removes_the_root_it_created_whatever_was_left_in_it(kind, tmp_path):
    box = make(kind, tmp_path, None)
    root, ws = box.root, box.workdir
    writer = ("setsid sh -c 'while :; do mkdir -p \"$HOME/again\"; : > \"$HOME/again/f$$\"; sleep 0.01; done' "
              "</dev/null >/dev/null 2>&1 &")
    locked = "mkdir -p mod/cache/x && echo v > mod/cache/x/f && chmod -R a-w mod"
    assert sh(box, f"{locked} && {writer} echo ok", timeout=30).stdout == "ok\n"
    box.start("bg", ["/bin/sh", "-c", writer + " sleep 300"])
    wait_until(lambda: (box.home / "again").is_dir(), 30, "the stray writing into the sandbox")
    box.close()
    assert not root.exists() and not ws.exists()
    assert strays.holders(root=root) == []


def test_a_caller_workspace_is_kept_and_the_root_removed(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    box = make("local", tmp_path, ws)
    sh(box, "mkdir -p ro/x && chmod -R a-w ro", timeout=30)
    root = box.root
    box.close()
    assert ws.is_dir() and (ws / "ro" / "x").is_dir() and not root.exists()


def test_remove_root_makes_read_only_directories_writable(tmp_path):
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f").write_text("x")
    for p in (root / "a" / "b", root / "a"):
        os.chmod(p, stat.S_IRUSR | stat.S_IXUSR)
    assert strays.remove_root(root) and not root.exists()
