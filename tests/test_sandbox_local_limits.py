"""sandbox=local run as root: its limits hold, or the run says they do not.

RLIMIT_NPROC never binds root, so max_processes is a pids cgroup of the sandbox's own; where none can be made, the
notice a run prints names max_processes as not applying. disk_mb counts the private TMPDIR too (it counted only
the workspace and home, so 200 MB written to TMPDIR passed a 100 MB quota). Run for real, as root only.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from slimecli.config.groups.sandbox import SandboxConfig
from slimecli.sandbox import pids
from slimecli.sandbox.factory import local_notice, make_sandbox

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason=f"local's limits as root: runs only as root "
                                                          f"(this is uid {os.geteuid()})")
BIN = str(Path(sys.executable).parent)
FORKS = """
import os, signal, time
kids = []
for _ in range({tries}):
    try:
        pid = os.fork()
    except OSError:  # EAGAIN: the pids cgroup is full
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    kids.append(pid)
print(len(kids), flush=True)
for pid in kids:
    os.kill(pid, signal.SIGKILL)
"""


def run(box, script: str):
    return asyncio.run(asyncio.wait_for(box.exec(["/bin/sh", "-c", script], timeout_s=60), 120))


def test_max_processes_holds_as_root_or_the_run_says_it_does_not():
    settings = SandboxConfig(name="local", max_processes=16)
    why = pids.unavailable()
    said = local_notice(settings)
    if why is not None:  # the run's own words, when it starts: the limit does not apply here
        assert f"sandbox.max_processes=16 does not apply here: {why}" in said
        pytest.skip(f"no pids cgroup here ({why}): the run says max_processes does not apply")
    assert "does not apply" not in said  # promised, so it must hold
    box = make_sandbox(settings, path_dirs=[BIN])
    try:
        assert box.cgroup is not None
        res = asyncio.run(box.exec(["python", "-c", FORKS.format(tries=64)], timeout_s=60))
        assert res.returncode == 0, res.stderr
        started = int(res.stdout)
        assert 0 < started < 16, started  # the launcher-turned-python counts as one of the 16
        run(box, "for i in $(seq 40); do setsid sleep 60 </dev/null >/dev/null 2>&1 & done 2>/dev/null")
        assert 0 < len(box.cgroup.pids()) <= 16  # the detached ones left behind stay in it, and within its limit
        cgroup = box.cgroup.path
    finally:
        box.close()
    assert not cgroup.exists()  # everything inside was killed and the cgroup removed


def test_disk_mb_holds_as_root_for_its_tmpdir_too():
    """The workspace and home: test_sandbox_isolation.py; TMPDIR is local's own (bwrap's /tmp is a sized tmpfs)."""
    box = make_sandbox(SandboxConfig(name="local", disk_mb=4), path_dirs=[BIN])
    try:
        res = run(box, "dd if=/dev/zero of=$TMPDIR/big bs=1M count=12 status=none; sleep 10; echo survived")
        assert res.killed_for == "disk" and box.violation == "disk", res
        assert "survived" not in res.stdout
    finally:
        box.close()
