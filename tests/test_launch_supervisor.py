"""The supervisor with real child processes: failures, readiness timeouts, Ctrl-C, controller death."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from slimecli.launch import pdeathsig
from slimecli.launch.spec import Probe, ProcessSpec
from slimecli.launch.supervisor import Supervisor
from tests.helpers import ROOT, free_port, pid_alive, wait_dead, wait_until

PY = sys.executable

# A server that records its pid (and its own child's pid) and answers HTTP on a port.
SERVER = textwrap.dedent("""
    import http.server, os, subprocess, sys, pathlib
    from slimecli.launch.watchdog import start_parent_watchdog
    start_parent_watchdog(0.2)
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    pathlib.Path(sys.argv[2]).write_text(f"{os.getpid()} {grandchild.pid}")
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def server_spec(tmp: Path, name: str, port: int, **kw) -> ProcessSpec:
    return ProcessSpec(name=name, argv=[PY, "-c", SERVER, str(port), str(tmp / f"{name}.pids")], kind="server",
                       probe=Probe(f"http://127.0.0.1:{port}/"), start_timeout_s=kw.pop("start_timeout_s", 30), **kw)


def worker_spec(name: str, code: str) -> ProcessSpec:
    return ProcessSpec(name=name, argv=[PY, "-c", code], kind="worker")


def pids_of(tmp: Path, name: str, count: int = 1) -> list[int]:
    """The pids a child wrote (servers: itself and its own child), once all `count` are there."""
    def written() -> list[int]:
        path = tmp / f"{name}.pids"
        pids = [int(p) for p in path.read_text().split()] if path.exists() else []
        return pids if len(pids) >= count else []

    return wait_until(written, 60, f"{name} to write its pid file")


def test_success_tears_down_servers_and_writes_logs(tmp_path):
    port = free_port()
    specs = [server_spec(tmp_path, "srv", port),
             worker_spec("work", f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/').read())")]
    code = Supervisor(specs, tmp_path / "logs", grace_s=3).run()
    assert code == 0
    assert "b'ok'" in (tmp_path / "logs" / "work.log").read_text()
    assert wait_dead(pids_of(tmp_path, "srv")) == []


def test_failing_child_tears_down_healthy_one(tmp_path, capsys):
    specs = [server_spec(tmp_path, "srv", free_port()),
             worker_spec("work", "import sys; print('about to fail'); sys.exit(3)")]
    code = Supervisor(specs, tmp_path / "logs", grace_s=3).run()
    out = capsys.readouterr().out
    assert code == 1
    assert "work exited (exit code 3)" in out and "about to fail" in out
    assert wait_dead(pids_of(tmp_path, "srv")) == []


def test_dying_server_fails_the_run(tmp_path, capsys):
    port = free_port()
    specs = [server_spec(tmp_path, "srv", port), worker_spec("work", "import time; time.sleep(60)")]
    sup = Supervisor(specs, tmp_path / "logs", grace_s=3)

    def kill_server_once_the_worker_runs():
        wait_until(lambda: any(c.spec.name == "work" for c in sup.children), 60, "the worker to start")
        os.kill(pids_of(tmp_path, "srv", 2)[0], signal.SIGKILL)

    import threading
    threading.Thread(target=kill_server_once_the_worker_runs, daemon=True).start()
    assert sup.run() == 1
    assert "srv was killed by SIGKILL (exit code -9)" in capsys.readouterr().out
    assert all(c.proc.poll() is not None for c in sup.children)


def test_readiness_timeout_names_process_and_log_tail(tmp_path, capsys):
    never = ProcessSpec(name="slowpoke", argv=[PY, "-c", "print('booting forever', flush=True); import time; time.sleep(60)"],
                        kind="server", probe=Probe(f"http://127.0.0.1:{free_port()}/health"), start_timeout_s=2)
    sup = Supervisor([never, worker_spec("work", "pass")], tmp_path / "logs", grace_s=2)
    assert sup.run() == 1
    out = capsys.readouterr().out
    assert "slowpoke was not ready within 2s" in out and "booting forever" in out
    assert [c.spec.name for c in sup.children] == ["slowpoke"]  # the worker never started
    assert sup.children[0].proc.poll() is not None


def test_term_ignoring_child_is_killed_after_grace(tmp_path):
    stubborn = worker_spec("stubborn", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                       "print('up', flush=True); time.sleep(60)")
    failing = worker_spec("fail", "import time; time.sleep(1); raise SystemExit(2)")
    sup = Supervisor([stubborn, failing], tmp_path / "logs", grace_s=1)
    assert sup.run() == 1
    assert sup.children[0].proc.returncode == -signal.SIGKILL


def test_a_stopped_group_handles_its_sigterm_without_waiting_out_the_grace():
    """SIGCONT follows SIGTERM: a stopped child (SIGSTOP) ends by the SIGTERM, not by the SIGKILL after the grace."""
    from slimecli.process import kill_group, state

    child = subprocess.Popen([PY, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, start_new_session=True)
    assert child.stdout is not None and child.stdout.readline() == b"up\n"
    os.kill(child.pid, signal.SIGSTOP)
    wait_until(lambda: state(child.pid) == "T", 30, "the child to stop")
    kill_group(child.pid, grace_s=120, leader=child)
    assert child.wait(timeout=5) == -signal.SIGTERM


CONTROLLER = textwrap.dedent("""
    import sys
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from tests.test_launch_supervisor import server_spec, worker_spec
    from slimecli.launch.supervisor import Supervisor
    tmp = Path(sys.argv[1])
    specs = [server_spec(tmp, "srv", int(sys.argv[2])),
             worker_spec("work", "import os, time, pathlib; pathlib.Path(%r).write_text(str(os.getpid())); time.sleep(600)"
                         % str(tmp / "work.pids"))]
    sys.exit(Supervisor(specs, tmp / "logs", grace_s=3).run())
""").format(root=str(ROOT))


def start_controller(tmp: Path) -> subprocess.Popen:
    proc = subprocess.Popen([PY, "-c", CONTROLLER, str(tmp), str(free_port())], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    wait_until(lambda: (tmp / "work.pids").exists(), 60, "the controller to start its children", proc=proc)
    return proc


def controller_children(tmp: Path) -> list[int]:
    return pids_of(tmp, "srv", 2) + pids_of(tmp, "work")


def test_ctrl_c_leaves_no_processes(tmp_path):
    proc = start_controller(tmp_path)
    pids = controller_children(tmp_path)
    assert all(pid_alive(p) for p in pids)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 128 + signal.SIGINT
    assert wait_dead(pids) == []


def test_sigterm_leaves_no_processes(tmp_path):
    proc = start_controller(tmp_path)
    pids = controller_children(tmp_path)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert wait_dead(pids) == []


def test_sigkilled_controller_takes_children_down(tmp_path):
    proc = start_controller(tmp_path)
    pids = controller_children(tmp_path)  # includes the server's own grandchild
    proc.kill()
    proc.wait()
    assert wait_dead(pids, timeout=10) == []


# The parent-death signal, set without preexec_fn (unsafe with the supervisor's threads).
READ_PDEATHSIG = ("import ctypes; sig = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(sig)); "  # PR_GET_PDEATHSIG
                  "print('pdeathsig', sig.value, flush=True)")


def test_children_get_the_parent_death_signal_and_keep_their_pid(tmp_path):
    argv = [PY, "-c", "import os; print('pid', os.getpid(), flush=True); " + READ_PDEATHSIG]
    sup = Supervisor([ProcessSpec(name="work", argv=argv, kind="worker")], tmp_path / "logs", grace_s=2)
    assert sup.run() == 0
    log = (tmp_path / "logs" / "work.log").read_text()
    assert f"pdeathsig {int(signal.SIGTERM)}" in log
    assert f"pid {sup.children[0].proc.pid}" in log  # the wrapper exec()s: the supervisor's pid is the child's


def test_children_start_with_default_signal_dispositions(tmp_path):
    """The wrapper is Python, which ignores SIGPIPE; the real command must not inherit that."""
    argv = ["/bin/sh", "-c", "grep SigIgn /proc/$$/status"]
    sup = Supervisor([ProcessSpec(name="work", argv=argv, kind="worker")], tmp_path / "logs", grace_s=2)
    assert sup.run() == 0
    ignored = int(re.search(r"SigIgn:\s*([0-9a-f]+)", (tmp_path / "logs" / "work.log").read_text())[1], 16)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # what Python ignores; what our own caller ignores is kept
        assert not ignored & (1 << (int(sig) - 1)), sig


def test_a_missing_command_is_a_failed_child_not_a_traceback(tmp_path, capsys):
    sup = Supervisor([ProcessSpec(name="work", argv=["slimecli-no-such-program"], kind="worker")], tmp_path / "logs",
                     grace_s=2)
    assert sup.run() == 1
    out = capsys.readouterr().out
    assert "work exited (exit code 127)" in out and "cannot run slimecli-no-such-program" in out


def test_a_child_whose_parent_died_before_the_signal_was_set_does_not_run(tmp_path):
    """The race prctl leaves open: the wrapper checks that its parent is still the one it was started by."""
    marker = tmp_path / "ran"
    not_our_parent = os.getppid()  # alive, but not the parent of the process started below
    proc = subprocess.run(pdeathsig.command([PY, "-c", f"open({str(marker)!r}, 'w')"], parent=not_our_parent))
    assert proc.returncode == 128 + signal.SIGTERM and not marker.exists()
    assert subprocess.run(pdeathsig.command([PY, "-c", f"open({str(marker)!r}, 'w')"])).returncode == 0
    assert marker.exists()


def test_quiet_console_shows_only_what_servers_warn_about(tmp_path):
    """verbose=False (observe.verbose=false): a server's routine lines go to its log only; its warnings, and
    everything a worker prints, still reach the console."""
    from io import StringIO

    from rich.console import Console

    port = free_port()
    chatty = textwrap.dedent(f"""
        import http.server, sys
        print("engine INFO step line", flush=True)
        print("engine WARNING something to see", flush=True)
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
            def log_message(self, *a): pass
        http.server.HTTPServer(("127.0.0.1", {port}), H).serve_forever()
    """)
    specs = [ProcessSpec(name="srv", argv=[PY, "-c", chatty], kind="server", probe=Probe(f"http://127.0.0.1:{port}/"),
                         start_timeout_s=30),
             worker_spec("work", "print('worker says hello')")]
    out = StringIO()
    code = Supervisor(specs, tmp_path / "logs", console=Console(file=out, width=200), grace_s=3, verbose=False).run()
    assert code == 0
    shown = out.getvalue()
    assert "something to see" in shown and "worker says hello" in shown
    assert "step line" not in shown
    assert "engine INFO step line" in (tmp_path / "logs" / "srv.log").read_text()
