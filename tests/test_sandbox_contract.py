"""The sandbox contract, the same for every kind: exec, time limits, background commands, files, diff, close.

Parametrized over local and bwrap (skipped with the reason where bwrap cannot start); docker/podman argv
is checked without a daemon.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from slimecli.config.groups.sandbox import SandboxConfig
from slimecli.sandbox.factory import make_sandbox
from tests.helpers import wait_until

BIN = str(Path(sys.executable).parent)


def _bwrap_missing() -> str | None:
    from slimecli.sandbox.bwrap import available

    return available()


KINDS = [pytest.param("local"), pytest.param("bwrap", marks=pytest.mark.skipif(
    _bwrap_missing() is not None, reason=f"bwrap cannot start here: {_bwrap_missing()}"))]


@pytest.fixture(params=KINDS)
def box(request, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    sandbox = make_sandbox(SandboxConfig(name=request.param), ws, path_dirs=[BIN])
    yield sandbox
    sandbox.close()


def sh(sandbox, script: str, timeout: float = 60, **kw):
    return asyncio.run(sandbox.exec(["/bin/sh", "-c", script], timeout_s=timeout, **kw))


def test_exec_runs_in_the_workspace_with_a_scrubbed_environment(box, monkeypatch):
    monkeypatch.setenv("SLIMECLI_TEST_SECRET", "caller-secret")
    res = sh(box, "pwd; env", env={"X": "1"})
    assert res.returncode == 0 and res.stdout.splitlines()[0] == str(box.workdir)
    assert "caller-secret" not in res.stdout and "X=1" in res.stdout and f"HOME={box.home}" in res.stdout
    assert sh(box, "exit 7").returncode == 7
    assert sh(box, "kill -9 $$").returncode == 137  # killed by a signal: 128 + N, as a shell says it


def test_exec_kills_the_whole_tree_at_the_time_limit(box):
    res = sh(box, "trap '' TERM; sleep 300 & sleep 300; wait", timeout=1)
    assert res.timed_out and res.returncode is None and res.killed_for == "timeout"
    assert sh(box, "echo still usable").stdout == "still usable\n"


def test_start_poll_output_kill(box):
    box.start("ok", ["/bin/sh", "-c", "echo out; echo err >&2; exit 3"])
    assert wait_until(lambda: box.poll("ok") is not None, 30, "the command to exit") and box.poll("ok") == 3
    assert box.output("ok") == ("out\n", "err\n")
    box.start("hang", ["/bin/sh", "-c", "trap '' TERM; echo started; sleep 300"])
    wait_until(lambda: box.output("hang")[0] == "started\n", 30, "the command's first line")
    assert box.poll("hang") is None
    box.kill("hang")
    assert box.poll("hang") is not None and box.output("hang")[0] == "started\n"


def test_files_stay_inside_the_workspace_and_home(box, tmp_path):
    box.write_file("sub/a.txt", "content")
    assert box.read_file("sub/a.txt") == "content" and box.read_file("missing") is None
    assert sh(box, "cat sub/a.txt && echo more >> sub/a.txt").returncode == 0  # the sandbox user may change it
    assert box.read_file(box.workdir / "sub/a.txt") == "contentmore\n"
    box.write_file(box.home / ".cfg/x", "h")
    assert sh(box, "cat ~/.cfg/x && rm ~/.cfg/x").stdout == "h"
    outside = tmp_path / "outside.txt"
    outside.write_text("host")
    with pytest.raises(ValueError):
        box.write_file(outside, "x")
    with pytest.raises(ValueError):
        box.read_file("../outside.txt")
    (box.workdir / "link").symlink_to(outside)  # planted by the agent: the host must not follow it out
    assert box.read_file("link") is None
    with pytest.raises(OSError):
        box.write_file("link", "x")
    assert outside.read_text() == "host"


def test_diff_includes_untracked_files_honours_excludes_and_runs_no_repository_commands(box, tmp_path):
    setup = ("git init -q . && git config user.email t@e && git config user.name t && echo a > a.txt && "
             "git add a.txt && git commit -qm base")
    assert sh(box, setup).returncode == 0, sh(box, setup).stderr
    pwned = tmp_path / "pwned"
    hostile = f"touch {pwned}; touch {box.workdir}/fsmonitor-ran; exit 1"
    box.write_file(".git/hook.sh", f"#!/bin/sh\n{hostile}\n")
    assert sh(box, "chmod +x .git/hook.sh && git config core.fsmonitor \"$PWD/.git/hook.sh\" && "
                   "git config diff.external \"$PWD/.git/hook.sh\"").returncode == 0
    box.write_file("a.txt", "b\n")
    box.write_file("new.txt", "untracked\n")
    box.write_file("PROBLEM_STATEMENT.md", "harness file\n")
    diff = asyncio.run(box.diff(exclude=["PROBLEM_STATEMENT.md"]))
    assert "+b" in diff and "new.txt" in diff and "+untracked" in diff and "PROBLEM_STATEMENT" not in diff
    assert not pwned.exists() and not (box.workdir / "fsmonitor-ran").exists()


def test_close_leaves_nothing_running_and_removes_what_it_created(tmp_path):
    for kind in ("local", "bwrap") if _bwrap_missing() is None else ("local",):
        sandbox = make_sandbox(SandboxConfig(name=kind), None)
        root, ws = sandbox.root, sandbox.workdir
        sandbox.start("bg", ["/bin/sh", "-c", "sleep 300"])
        sandbox.close()
        sandbox.close()  # idempotent
        assert not root.exists() and not ws.exists()
        with pytest.raises(RuntimeError):
            sandbox.start("again", ["true"])


def test_auto_is_bwrap_where_it_starts_and_never_local():
    from slimecli.sandbox.auto import choose
    from slimecli.sandbox.factory import SandboxUnavailable, resolve_kind

    choice = choose(SandboxConfig(name="auto"))
    if _bwrap_missing() is None:
        assert choice.kind == "bwrap" and resolve_kind(SandboxConfig(name="auto")) == "bwrap"
    elif choice.kind is None:  # no container runtime with its image either: refused (tests/test_sandbox_auto.py)
        with pytest.raises(SandboxUnavailable):
            resolve_kind(SandboxConfig(name="auto"))
    assert choice.kind != "local"
    assert resolve_kind(SandboxConfig(name="local")) == "local"


def test_container_run_argv_mounts_not_uploads_and_has_no_network(tmp_path):
    from slimecli.sandbox.container import ContainerSandbox

    ws = tmp_path / "ws"
    ws.mkdir()
    settings = SandboxConfig(name="docker", binary="/nonexistent/docker", max_processes=64, memory_mb=512)
    box = ContainerSandbox(ws, runtime="docker", image="img:1", settings=settings, ro_paths=[str(tmp_path)])
    try:
        argv = box.run_argv(["make", "test"], box.env(), ws, "n1")
    finally:
        box.relay = None
        box._release = lambda: None  # no daemon to ask
        box.close()
    joined = " ".join(argv)
    assert argv[:3] == ["/nonexistent/docker", "run", "--rm"] and "--network none" in joined
    assert f"-v {ws}:{ws}:rw" in joined and f"-v {box.home}:{box.home}:rw" in joined
    assert f"-v {tmp_path}:{tmp_path}:ro" in joined and "--pids-limit 64" in joined and "--memory 512m" in joined
    assert "--cap-drop ALL" in joined and "no-new-privileges" in joined and "img:1" in argv
    assert argv[-3:] == ["--", "make", "test"]


def test_a_missing_runtime_is_reported_not_crashed():
    from slimecli.sandbox.factory import SandboxUnavailable

    with pytest.raises(SandboxUnavailable, match="not installed"):
        make_sandbox(SandboxConfig(name="podman", binary="/nonexistent/podman"))


def test_rules_reject_unknown_kinds_with_did_you_mean_and_non_positive_limits():
    from tests.helpers import invoke_cli

    proc = invoke_cli("config", "validate", "sandbox=bwarp")
    assert proc.returncode == 2 and "did you mean 'bwrap'?" in proc.stderr
    proc = invoke_cli("config", "validate", "sandbox.max_processes=0", "sandbox.uid=0", "sandbox.extra_ro_paths=[rel]")
    assert proc.returncode == 2
    assert "sandbox.max_processes: must be > 0" in proc.stderr and "sandbox.uid" in proc.stderr
    assert "sandbox.extra_ro_paths[0]: must be an absolute path" in proc.stderr
    assert os.environ.get("SLIMECLI_TEST_SECRET") is None
