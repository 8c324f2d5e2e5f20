"""The run's template (launch/template.py, launch/forked.py): a real template process imports torch once and
forks the children asked of it; each is this process's own child (adopted), in a session of its own, with the
requested argv, environment and working directory, its output on the pipe it was given, its exit code read by
waitpid, and it dies with its controller like a child started by Popen.

The children here are `python -m slimecli.launch.pdeathsig PPID SIG COMMAND...`: a real slimecli module that
execs a shell command (and checks its parent is PPID, which only an adopted child passes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from slimecli.cli.entry import launches_a_run
from slimecli.launch import forked
from slimecli.launch.child_env import child_env
from slimecli.launch.forked import ForkedProcess, Template, forkable
from tests.helpers import ROOT, pid_alive, wait_dead

pytestmark = pytest.mark.slow  # the template imports torch and transformers (~3 s)
ON = {**os.environ, "SLIMECLI_TEMPLATE": "1"}  # the default (launch/forked.py), whatever this shell says


def shell(command: str, parent: int | None = None) -> list[str]:
    return [sys.executable, "-m", "slimecli.launch.pdeathsig", str(parent or os.getpid()), "15", "sh", "-c", command]


def stat_fields(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("template") / "template.log"
    t = Template.start(ON, log)
    assert t is not None
    yield t
    t.close()
    assert t.proc.poll() is not None


def test_a_child_runs_as_asked_is_adopted_and_its_exit_code_and_output_come_back(template, tmp_path):
    env = {**ON, "SLIMECLI_PROBE": "42"}
    proc = template.fork(shell('echo "cwd=$(pwd) probe=$SLIMECLI_PROBE"; echo to-stderr >&2; exit 3'), env,
                         str(tmp_path))
    assert isinstance(proc, ForkedProcess), template.why
    out = proc.stdout.read().decode()
    assert proc.wait(timeout=30) == 3
    assert f"cwd={tmp_path} probe=42" in out and "to-stderr" in out

    sleeper = template.fork(shell("sleep 60"), ON, None)
    assert sleeper is not None
    ppid, pgrp, session = (int(x) for x in stat_fields(sleeper.pid)[1:4])
    assert ppid == os.getpid()  # adopted: waitpid and the process-group signals work as for Popen
    assert pgrp == session == sleeper.pid  # its own session (before fork() returned), like start_new_session=True
    assert sleeper.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        sleeper.wait(timeout=0.2)
    os.killpg(sleeper.pid, signal.SIGKILL)
    assert sleeper.wait(timeout=30) == -signal.SIGKILL
    assert template.proc.poll() is None  # still serving


def test_only_commands_a_fresh_interpreter_would_run_alike_are_forked(template):
    env = ON
    assert not forkable(["/usr/bin/env", "-m", "slimecli.engine"])  # another program
    assert not forkable([sys.executable, "-m", "json.tool"])  # not slimecli's
    assert not forkable([sys.executable, "-c", "print(1)"])
    assert not forkable([sys.executable, "-m", "slimecli.launch.template"])
    # a variable read while the interpreter or its libraries start differs from the template's: not forked
    assert template.fork(shell("true"), {**env, "PYTHONPATH": "/elsewhere"}, None) is None
    assert template.fork(shell("true"), {**env, "MALLOC_ARENA_MAX": "1"}, None) is None
    assert template.fork(shell("true"), {**env, "OMP_WAIT_POLICY": "PASSIVE"}, None) is None  # read by OpenMP's init
    proc = template.fork(shell("exit 0"), {**env, "OMP_NUM_THREADS": "3"}, None)  # set by the child itself
    assert proc is not None and proc.wait(timeout=30) == 0


def test_children_die_with_the_controller_and_so_does_the_template(tmp_path):
    """kill -9 of the process that asked: its forked children get the parent-death signal, as Popen'd ones do."""
    script = textwrap.dedent(f"""
        import os, sys, time
        from pathlib import Path
        from slimecli.launch.forked import Template
        t = Template.start({{**os.environ, "SLIMECLI_TEMPLATE": "1"}}, Path({str(tmp_path / 'template.log')!r}))
        cmd = [sys.executable, "-m", "slimecli.launch.pdeathsig", str(os.getpid()), "15", "sleep", "300"]
        child = t.fork(cmd, {{**os.environ, "SLIMECLI_TEMPLATE": "1"}}, None)
        print(child.pid, t.proc.pid, flush=True)
        time.sleep(300)
    """)
    controller = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        child, template = (int(x) for x in controller.stdout.readline().split())
        assert pid_alive(child) and pid_alive(template)
        assert int(stat_fields(child)[1]) == controller.pid
    finally:
        controller.kill()
        controller.wait()
    assert wait_dead([child, template], timeout=30) == []


def test_a_template_that_cannot_serve_says_why_and_nothing_is_forked(tmp_path):
    """A template whose imports fail (here: PYTHONPATH hides torch behind a broken module) answers not ready;
    the supervisor then starts its children with Popen."""
    broken = tmp_path / "site"
    (broken / "torch").mkdir(parents=True)
    (broken / "torch" / "__init__.py").write_text("raise ImportError('a broken torch')\n")
    env = {**ON, "PYTHONPATH": f"{broken}{os.pathsep}{ROOT}"}
    t = Template.start(env, tmp_path / "template.log")
    assert t is not None
    try:
        assert t.fork(shell("true"), env, None) is None
        assert t.ready is False and "torch" in t.why and "a broken torch" in t.why
        deadline = time.monotonic() + 30
        while t.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert t.proc.poll() == 0  # it said why and left
    finally:
        t.close()


def test_on_by_default_and_off_when_asked():
    unset = {k: v for k, v in os.environ.items() if k != "SLIMECLI_TEMPLATE"}
    assert Template.start({**unset, "SLIMECLI_TEMPLATE": "0"}, Path("/nonexistent/template.log")) is None
    with pytest.raises(FileExistsError):  # on: it went on to make its log's folder
        Template.start(unset, Path("/dev/null/template.log"))


def test_commands_that_launch_a_run_start_its_template_first_and_the_run_takes_it(monkeypatch, tmp_path):
    """`slimecli train`, `eval` and `teacher serve` start the template before composing their config (start_early);
    the run's supervisor takes it when its children start with the same start variables, else ends it."""
    monkeypatch.setenv("SLIMECLI_TEMPLATE", "1")
    for args in ([], ["config", "show"], ["plan"], ["train", "--help"], ["eval", "-h"], ["train", "--dry-run"],
                 ["teacher"], ["rollout", "serve"], ["teacher", "serve", "--help"]):
        assert not launches_a_run(args), args
    for args in (["train", "trainer.max_steps=1"], ["eval"], ["teacher", "serve", "model.path=DIR"]):
        assert launches_a_run(args), args
    env = {**os.environ, **child_env(), "SLIMECLI_RUN_DIR": str(tmp_path)}
    forked.start_early()
    (early,) = forked._early
    policy = "ACTIVE" if os.environ.get("OMP_WAIT_POLICY") == "PASSIVE" else "PASSIVE"
    other = Template.start({**env, "OMP_WAIT_POLICY": policy}, None)  # read as OpenMP loads: not this template
    try:
        assert other is not None and other is not early and forked._early == []
        assert early.proc.wait(timeout=30) is not None  # ended, not left behind
    finally:
        assert other is not None
        other.close()
    forked.start_early()
    (early,) = forked._early
    forked.drop_early()
    assert early.proc.poll() is not None and forked._early == []
    forked.start_early()
    (early,) = forked._early
    log = tmp_path / "logs" / "template.log"
    taken = Template.start(env, log)
    try:
        assert taken is early and forked._early == [] and log.is_file()
        assert taken.proc.poll() is None
    finally:
        assert taken is not None
        taken.close()


def test_a_command_that_stops_before_its_run_ends_its_early_template():
    """A config error ends the command before any run: the template it started early ends with it."""
    script = ("import sys\nfrom slimecli.launch import forked\nforked.start_early()\n"
              "print(forked._early[0].proc.pid, flush=True)\nsys.exit(2)\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=ON, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert wait_dead([int(out.stdout)], timeout=30) == []


def test_a_serving_template_imports_no_transformers_model_code(tmp_path):
    """Engines and evaluators run the engine's own model code (model/plain_decoder.py): their template leaves
    transformers' out (1.4 CPU-seconds), and still forks them."""
    code = ("import sys; from slimecli.launch.template import SERVING_PRELOAD, preload; why = preload(SERVING_PRELOAD); "
            "print(repr(why), sorted(m for m in ('transformers.modeling_utils', 'torch._dynamo') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**ON, "OMP_NUM_THREADS": "1"}).stdout
    assert out.split() == ["''", "[]"]
    t = Template.start(ON, tmp_path / "template.log", serving=True)
    assert t is not None
    try:
        assert t.proc.args[-1] == "serving"
        proc = t.fork(shell("echo served"), ON, None)
        assert isinstance(proc, ForkedProcess), t.why
        assert "served" in proc.stdout.read().decode() and proc.wait(timeout=30) == 0
    finally:
        t.close()


def test_a_command_forks_its_server_from_itself_with_one_import_of_torch(tmp_path):
    """fork_here (`slimecli agent run`'s engine): the child is this process's, in a session of its own, runs the
    module with the environment and directory asked, its output in the file given; this process's other files
    and atexit functions stay behind, and torch was imported once, with one OpenMP thread."""
    (tmp_path / "probe_mod.py").write_text(textwrap.dedent("""
        import json, os, sys
        print(json.dumps({"session": os.getsid(0) == os.getpid(), "fds": sorted(os.listdir("/proc/self/fd")),
                          "probe": os.environ.get("PROBE"), "cwd": os.getcwd(), "argv": sys.argv[1:],
                          "torch": "torch" in sys.modules}), flush=True)
        sys.exit(7)
    """))
    script = textwrap.dedent(f"""
        import atexit, json, os, sys
        sys.path.insert(0, {str(tmp_path)!r})
        from slimecli.launch.template import fork_here
        atexit.register(lambda: open({str(tmp_path / 'atexit')!r}, "a").write("x"))
        stray = open({str(tmp_path / 'stray')!r}, "w")
        out = os.open({str(tmp_path / 'out.log')!r}, os.O_WRONLY | os.O_CREAT)
        pid = fork_here([sys.executable, "-m", "probe_mod", "a", "b"], {{**os.environ, "PROBE": "1"}},
                        {str(tmp_path)!r}, out, imports=("torch",))
        assert os.getsid(pid) == pid  # its own session before its pid is returned: its group can be signalled
        _, status = os.waitpid(pid, 0)
        import asyncio

        async def in_loop():  # a child would find this loop running: not forked here
            return fork_here([sys.executable, "-m", "probe_mod"], dict(os.environ), None, out, imports=())
        print(json.dumps({{"code": os.waitstatus_to_exitcode(status), "omp": os.environ.get("OMP_NUM_THREADS"),
                          "atexit": os.path.exists({str(tmp_path / 'atexit')!r}), "in_loop": asyncio.run(in_loop())}}))
    """)
    env = {k: v for k, v in ON.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    parent = json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                       env=env).stdout)
    assert parent == {"code": 7, "omp": None, "atexit": False, "in_loop": None}  # the child ran no atexit function of its parent
    child = json.loads((tmp_path / "out.log").read_text())
    assert child["session"] and child["probe"] == "1" and child["cwd"] == str(tmp_path)
    assert child["argv"] == ["a", "b"] and child["torch"]  # imported before the fork, not again
    assert child["fds"] == ["0", "1", "2", "3"]  # stdio, and the listing's own: not the parent's stray file
    assert (tmp_path / "atexit").read_text() == "x"  # the parent's, once, at its own exit
