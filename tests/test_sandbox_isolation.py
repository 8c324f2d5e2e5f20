"""What an agent acting inside a bwrap sandbox must not be able to do, each tried the way an agent would:
by exec()ing shell and Python commands inside it. Skipped with the reason where bwrap cannot start."""

from __future__ import annotations

import asyncio
import http.server
import secrets
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from slimecli.config.groups.sandbox import SandboxConfig
from slimecli.sandbox.bwrap import BwrapSandbox, available
from slimecli.sandbox.quota import usage
from tests.helpers import ROOT, host_processes_with, pid_alive, wait_until

pytestmark = pytest.mark.skipif(available() is not None, reason=f"bwrap cannot start here: {available()}")
BIN = str(Path(sys.executable).parent)


@pytest.fixture
def make(tmp_path):
    made = []

    def make(**settings) -> BwrapSandbox:
        ws = tmp_path / f"ws{len(made)}"
        ws.mkdir()
        ports = settings.pop("allow_ports", ())
        box = BwrapSandbox(ws, settings=SandboxConfig(name="bwrap", **settings), path_dirs=[BIN], allow_ports=ports)
        made.append(box)
        return box

    yield make
    for box in made:
        box.close()


def sh(box, script: str, timeout: float = 120):
    return asyncio.run(box.exec(["/bin/sh", "-c", script], timeout_s=timeout))


def test_writes_outside_the_workspace_fail_and_reach_nothing_on_the_host(make, tmp_path):
    box = make()
    name = f"escape-{secrets.token_hex(4)}"
    targets = [f"/etc/{name}", str(ROOT / name), str(tmp_path / name), f"/root/{name}", f"/{name}",
               str(Path(sys.prefix) / name)]
    for target in targets:
        res = sh(box, f"echo x > {target}")
        assert res.returncode != 0 or not Path(target).exists(), target
        assert not Path(target).exists(), f"{target} appeared on the host"
    assert sh(box, f"echo x > {box.workdir}/{name}").returncode == 0 and (box.workdir / name).exists()


def test_a_run_directory_of_the_host_is_not_readable(make, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    (run_dir / "config.yaml").write_text("secret: run-config\n")
    box = make()
    res = sh(box, f"cat {run_dir}/config.yaml; ls {run_dir}; ls {ROOT}")
    assert "run-config" not in res.stdout and "config.yaml" not in res.stdout and "pyproject" not in res.stdout
    assert "secret" not in sh(box, "cat /etc/shadow 2>&1").stdout


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # the http.server API
        body = f"hello from {self.server.server_port}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        return None


def test_only_the_allowed_loopback_port_is_reachable(make):
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello) for _ in range(2)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    allowed, other = (s.server_port for s in servers)
    try:
        box = make(allow_ports=[allowed])
        get = "import sys, urllib.request as u; print(u.urlopen(f'http://127.0.0.1:{sys.argv[1]}', timeout=10).read())"
        res = asyncio.run(box.exec(["python3", "-c", get, str(allowed)], timeout_s=60))
        assert res.returncode == 0 and f"hello from {allowed}" in res.stdout, res.stderr
        res = asyncio.run(box.exec(["python3", "-c", get, str(other)], timeout_s=60))
        assert res.returncode != 0 and "Connection refused" in res.stderr
        assert f"hello from {other}" not in res.stdout
    finally:
        for s in servers:
            s.shutdown()


def test_host_processes_cannot_be_signalled(make):
    victim = subprocess.Popen(["sleep", "1000"])
    try:
        box = make()
        res = sh(box, f"kill -9 {victim.pid}; kill -TERM {victim.pid}; echo done")
        assert "done" in res.stdout and victim.poll() is None and pid_alive(victim.pid)
        assert str(victim.pid) not in sh(box, "ls /proc").stdout.split()
    finally:
        victim.kill()
        victim.wait()


def test_the_callers_environment_is_invisible(make, monkeypatch):
    secret = f"s3cret-{secrets.token_hex(6)}"
    monkeypatch.setenv("SLIMECLI_CALLER_SECRET", secret)
    box = make()
    res = sh(box, "env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; cat /proc/1/environ 2>&1")
    assert secret not in res.stdout and secret not in res.stderr


def test_no_process_survives_close(make):
    marker = f"slimecli-marker-{secrets.token_hex(6)}"
    box = make()
    sleeper = f"python3 -c 'import time; time.sleep(1000)' {marker}"
    box.start("agent", ["/bin/sh", "-c", f"( setsid nohup {sleeper} >/dev/null 2>&1 & ) ; nohup {sleeper} & sleep 1000"])
    wait_until(lambda: len(host_processes_with(marker)) >= 2, 30, "both sleepers to start")
    box.close()
    assert host_processes_with(marker) == []


def test_the_disk_quota_stops_one_huge_file_and_many_medium_files(make):
    box = make(disk_mb=32, max_file_mb=8)
    res = sh(box, "head -c 64M /dev/zero > huge.bin; echo rc=$?")
    assert "rc=0" not in res.stdout and (box.workdir / "huge.bin").stat().st_size <= 8 << 20  # EFBIG / SIGXFSZ
    sh(box, "rm huge.bin")
    res = sh(box, "i=0; while [ $i -lt 100 ]; do head -c 4M /dev/zero > f$i.bin || exit 9; i=$((i+1)); done")
    assert res.killed_for == "disk" and res.returncode is None and box.violation == "disk"
    written = usage(box.workdir)
    assert written < 100 * (4 << 20) / 2  # far from all 100 files: stopped near the 32 MiB quota
    assert sh(box, "echo after").killed_for == "disk"  # the sandbox stays stopped


def test_a_fork_bomb_is_stopped_by_the_process_limit(make):
    box = make(max_processes=64)
    bomb = ("import subprocess\nps = []\ntry:\n    for _ in range(2000):\n"
            "        ps.append(subprocess.Popen(['sleep', '100']))\nexcept OSError as e:\n"
            "    print('stopped', len(ps), e.errno)\nfor p in ps:\n    p.kill()\n")
    res = asyncio.run(box.exec(["python3", "-c", bomb], timeout_s=120))
    assert res.returncode == 0 and "stopped" in res.stdout, res.stderr
    assert int(res.stdout.split()[1]) < 64
    assert subprocess.run(["true"]).returncode == 0  # the host can still start processes


def test_the_sandbox_is_its_own_host_with_an_unprivileged_user(make):
    box = make()
    res = sh(box, "hostname; id -u; grep NoNewPrivs /proc/self/status; ip -o link 2>/dev/null | wc -l")
    lines = res.stdout.split()
    assert lines[0] == "sandbox" and lines[1] != "0" and "1" in lines[2:4]
