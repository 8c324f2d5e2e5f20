"""Start-up: the trainer starts while the engines load (the supervisor still holds each to its readiness timeout),
`slimecli train --profile-startup` reports each process's phases, and the controller never imports torch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from slimecli.launch.spec import Probe, ProcessSpec
from slimecli.launch.supervisor import Supervisor
from slimecli.observe import startup
from tests.helpers import ROOT, free_port, wait_dead, wait_until

PY = sys.executable

# A server whose probe answers 200 only once the file argv[2] exists: a worker that starts only after the server is
# ready never makes it, so the run can only end well when the worker starts beside it.
GATED = textwrap.dedent("""
    import http.server, pathlib, sys
    gate = pathlib.Path(sys.argv[2])
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if gate.exists() else 503); self.end_headers()
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")

OPENS_THE_GATE = textwrap.dedent("""
    import pathlib, sys, time, urllib.error, urllib.request
    pathlib.Path(sys.argv[1]).write_text("go")
    for _ in range(600):
        try:
            urllib.request.urlopen(sys.argv[2], timeout=2); print("server ready, work done"); break
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    else:
        sys.exit(5)
""")


def test_workers_start_beside_a_server_they_wait_for(tmp_path):
    port, gate = free_port(), tmp_path / "gate"
    url = f"http://127.0.0.1:{port}/health"
    server = ProcessSpec(name="engine-0", argv=[PY, "-c", GATED, str(port), str(gate)], kind="server",
                         probe=Probe(url), start_timeout_s=60, awaited_by_workers=True)
    worker = ProcessSpec(name="trainer", argv=[PY, "-c", OPENS_THE_GATE, str(gate), url], kind="worker")
    assert Supervisor([server, worker], tmp_path / "logs", grace_s=2).run() == 0
    assert "server ready, work done" in (tmp_path / "logs" / "trainer.log").read_text()


def test_a_server_the_workers_wait_for_still_has_its_readiness_timeout(tmp_path, capsys):
    never = ProcessSpec(name="engine-0", argv=[PY, "-c", "print('loading forever', flush=True); import time; "
                                                       "time.sleep(60)"],
                        kind="server", probe=Probe(f"http://127.0.0.1:{free_port()}/health"), start_timeout_s=2,
                        awaited_by_workers=True)
    sup = Supervisor([never, ProcessSpec(name="trainer", argv=[PY, "-c", "import time; time.sleep(60)"],
                                         kind="worker")], tmp_path / "logs", grace_s=2)
    assert sup.run() == 1
    out = capsys.readouterr().out
    assert "engine-0 was not ready within 2s" in out and "loading forever" in out
    assert sup.failed == "server"  # not a worker's failure: no restart of the run for it
    assert [c.spec.name for c in sup.children] == ["engine-0", "trainer"]
    assert all(c.proc.poll() is not None for c in sup.children)  # the worker that started beside it is down too


def test_marks_are_recorded_only_when_profiling_and_named(tmp_path, monkeypatch):
    path = tmp_path / "logs" / startup.STARTUP_FILE
    monkeypatch.setattr(startup, "_name", [])
    monkeypatch.delenv(startup.STARTUP_ENV, raising=False)
    startup.name("engine-0")
    startup.mark("imported", path)
    assert not path.exists()
    monkeypatch.setenv(startup.STARTUP_ENV, "1")
    startup.mark("imported", path)
    startup.mark("ready", path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["process"], r["phase"]) for r in rows] == [("engine-0", "imported"), ("engine-0", "ready")]
    assert rows[0]["started"] <= rows[0]["at"] <= rows[1]["at"] and rows[0]["cpu_s"] <= rows[1]["cpu_s"]


def test_the_table_has_a_row_per_process_and_a_column_per_phase(tmp_path):
    path = tmp_path / startup.STARTUP_FILE
    rows = [("engine-0", 10, 100.5, "imported", 102.0, 1.5), ("engine-0", 10, 100.5, "ready", 104.0, 3.0),
            ("trainer rank 0", 11, 100.7, "imported", 103.0, 1.8),
            ("trainer rank 0", 11, 100.7, "first step", 108.0, 4.0),
            ("engine-0", 12, 90.0, "imported", 91.0, 1.0)]  # an earlier start of engine-0: the latest is shown
    path.write_text("".join(json.dumps({"process": p, "pid": pid, "started": s, "phase": ph, "at": at, "cpu_s": c})
                            + "\n" for p, pid, s, ph, at, c in rows) + '{"process": "cut off\n')
    found = startup.read(path)
    assert [(p.process, p.started) for p in found] == [("engine-0", 100.5), ("trainer rank 0", 100.7)]
    lines = startup.table(found, since=100.0)
    assert lines[0].split() == ["process", "started", "imported", "ready", "first", "step"]  # phases in order
    assert lines[1].split() == ["engine-0", "0.50", "2.00", "(", "1.50)", "4.00", "(", "3.00)", "-"]
    assert lines[2].split()[:4] == ["trainer", "rank", "0", "0.70"] and lines[2].split()[-2:] == ["(", "4.00)"]
    assert "7.00 CPU-seconds in all" in lines[-1]


@pytest.mark.slow
def test_profile_startup_reports_every_process_and_the_controller_never_imports_torch(tmp_path, tiny):
    """A one-step quickstart with --profile-startup, its controller in this interpreter's own process tree, started
    as the `slimecli` command starts it (its entry point). With LoRA on a model.path, whose target modules the
    controller checks against the model's own (launch/lora_checks.py) from its config.json."""
    run = tmp_path / "run"
    code = (
        "import sys\n"
        "from slimecli.cli.entry import main\n"
        f"sys.argv = ['slimecli', 'train', 'trainer.max_steps=1', 'run.dir={run}', 'model.path={tiny}', "
        "'trainer.lora.rank=8', '--profile-startup']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "assert 'torch' not in sys.modules, 'the controller imported torch'\n"
        "print('NO_TORCH')\n"
    )
    env = {**os.environ, "SLIMECLI_TEMPLATE": "1"}  # the run's template too (launch/template.py)
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)
    assert "NO_TORCH" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    table = out.stdout[out.stdout.index("start-up"):]
    names = [p.process for p in startup.read(run / "logs" / startup.STARTUP_FILE)]
    # the template imported torch and transformers once; the others were forked from it (launch/template.py)
    assert sorted(names) == ["engine-0", "ranks of slimecli.train", "template", "trainer rank 0", "trainer rank 1"]
    for name in ("controller", *names):
        assert f"\n{name} " in table
    first_step = next(line for line in table.splitlines() if line.startswith("trainer rank 0"))
    assert first_step.split()[-1] != "-"  # rank 0 reached its first step
    # the command started the template before it had composed the config (launch/forked.py: start_early)
    template = next(p for p in startup.read(run / "logs" / startup.STARTUP_FILE) if p.process == "template")
    assert template.started < (run / "config.yaml").stat().st_mtime


# A rank module for slimecli.launch.ranks: records what it was given, joins the gloo group, rank 1 fails on demand.
RANK_MODULE = textwrap.dedent("""
    import json, os, sys, time
    preloaded = "torch" in sys.modules  # before this module's own imports: what the launcher loaded
    extra = "wave" in sys.modules  # --preload wave
    out = os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json")
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")
    record = {k: os.environ.get(k) for k in keys}
    record.update(pid=os.getpid(), ppid=os.getppid(), preloaded=preloaded, extra=extra, argv=sys.argv[1:])

    def write():  # whole or not at all: the test reads it as soon as it exists
        with open(out + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(out + ".tmp", out)

    if sys.argv[2] in ("fail", "sleep"):
        write()
        if os.environ["RANK"] == "1" and sys.argv[2] == "fail":
            raise ValueError("rank one gives up")
        time.sleep(120)
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    total = torch.tensor([int(os.environ["RANK"]) + 1])
    dist.all_reduce(total)
    record["sum"] = int(total)
    dist.destroy_process_group()
    write()
""")


def rank_spec(tmp_path, mode: str, **env: str) -> ProcessSpec:
    package = tmp_path / "pkg" / "fakerank"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(RANK_MODULE)
    return ProcessSpec(name="trainer", kind="worker", env={"PYTHONPATH": str(tmp_path / "pkg"), **env},
                       argv=[PY, "-m", "slimecli.launch.ranks", "--nproc", "2", "--preload", "wave", "-m", "fakerank",
                             str(tmp_path), mode])


@pytest.mark.slow
@pytest.mark.parametrize("fork", ["1", "0"])
def test_ranks_get_what_torchrun_gives_and_form_a_group(tmp_path, fork):
    env = {"SLIMECLI_FORK_RANKS": fork}
    assert Supervisor([rank_spec(tmp_path, "ok", **env)], tmp_path / "logs", grace_s=2).run() == 0
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r, got in enumerate(ranks):
        assert (got["RANK"], got["LOCAL_RANK"], got["WORLD_SIZE"], got["LOCAL_WORLD_SIZE"]) == (str(r), str(r), "2", "2")
        assert got["MASTER_ADDR"] == "127.0.0.1" and got["MASTER_PORT"] == ranks[0]["MASTER_PORT"]
        assert got["OMP_NUM_THREADS"] == "1" and got["argv"] == [str(tmp_path), "ok"] and got["sum"] == 3
        assert got["preloaded"] is got["extra"] is (fork == "1")  # forked from the launcher, torch (and --preload) imported
    assert ranks[0]["ppid"] == ranks[1]["ppid"]  # both the launcher's children


def test_a_failing_rank_stops_the_other_and_is_named_in_one_line(tmp_path, capsys):
    code = Supervisor([rank_spec(tmp_path, "fail")], tmp_path / "logs", grace_s=2).run()
    out = capsys.readouterr().out.rstrip().splitlines()
    assert code == 1
    assert out[-1] == ("trainer failed: rank 1: ValueError: rank one gives up (exit code 1; full log: "
                       f"{tmp_path / 'logs' / 'trainer.log'})"), out[-20:]
    survivor = json.loads((tmp_path / "rank0.json").read_text())["pid"]
    assert wait_dead([survivor]) == []


def test_a_terminated_launcher_takes_its_ranks_down(tmp_path):
    spec = rank_spec(tmp_path, "sleep")
    proc = subprocess.Popen(spec.argv, env={**os.environ, **spec.env}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        files = [tmp_path / f"rank{r}.json" for r in (0, 1)]
        wait_until(lambda: all(f.exists() for f in files) or proc.poll() is not None, 120, "both ranks to start")
        pids = [json.loads(f.read_text())["pid"] for f in files]
        proc.send_signal(signal.SIGTERM)  # the launcher alone, as the kernel's parent-death signal does
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        assert wait_dead(pids) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_the_launchers_report_names_a_killed_rank_as_torchruns_does():
    from slimecli.launch.failure import reason

    lines = ["train step 4/6 [1s, ETA 2s] step reward 0.007",
             "slimecli.launch.ranks: rank 1 failed (exitcode: -9) local_rank: 1; stopping the 1 other rank(s)",
             "Root Cause (first observed failure):", "  rank      : 1", "  exitcode  : -9"]
    assert reason(lines) == "rank 1 was killed by SIGKILL"
