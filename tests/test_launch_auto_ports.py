"""Ports are "auto" by default: each run picks free ports when it starts, writes them into its config.yaml
and plan.json, and a second run on the same machine does not fail for a port the first one holds. The two runs
started together are also the end-to-end tests of a junk-returning python reward and of stateless Adam."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from rich.console import Console

from slimecli.config.compose import load
from slimecli.config.errors import ConfigErrors
from slimecli.config.io import load_frozen
from slimecli.launch import controller
from slimecli.launch.free_ports import with_free_ports, with_free_rollout_port
from slimecli.launch.rundir import prepare
from slimecli.net import ports
from slimecli.net.ports import free_ports
from slimecli.observe.metrics import read_metrics
from tests.helpers import ROOT, invoke_cli


def listening(port: int) -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def test_a_block_of_free_ports_is_consecutive_and_bindable(monkeypatch: pytest.MonkeyPatch) -> None:
    base = free_ports("127.0.0.1", 3)
    held = [listening(port) for port in range(base, base + 3)]  # each one binds: none was taken
    try:
        one = free_ports("127.0.0.1", 1)
        assert one not in range(base, base + 3)  # not one of the ports in use
        listening(one).close()
        # a first port whose next one is in use is passed over: the whole block is checked, not its first port
        first = next(p for p in (base - 1, *range(base + 3, base + 40)) if ports._bindable("127.0.0.1", p))
        if first != base - 1 and ports._bindable("127.0.0.1", first + 1):  # else base or another's port is next
            held.append(listening(first + 1))
        offered = iter([first, *(ports.free_port("127.0.0.1") for _ in range(20))])
        monkeypatch.setattr(ports, "free_port", lambda host: next(offered))
        again = free_ports("127.0.0.1", 2)
        assert again != first
        listening(again).close()
        listening(again + 1).close()
    finally:
        for s in held:
            s.close()


@pytest.fixture
def teacher_dir(tmp_path: Path) -> Path:
    """What the config rules accept as a teacher checkpoint (nothing loads it here)."""
    (tmp_path / "teacher").mkdir()
    (tmp_path / "teacher" / "config.json").write_text("{}")
    return tmp_path / "teacher"


def test_auto_ports_are_picked_and_explicit_ones_kept(teacher_dir: Path) -> None:
    cfg = load(["rollout.num_engines=2"])
    assert (cfg.rollout.port, cfg.teacher.port, cfg.agent.port) == ("auto", "auto", "auto")
    picked = with_free_ports(cfg)
    port = picked.rollout.port
    assert isinstance(port, int)
    for s in [listening(port), listening(port + 1)]:  # engine k on rollout.port + k: both free
        s.close()
    assert picked.teacher.port == "auto"  # no teacher server launched: nothing to pick
    assert picked.agent.port == "auto"  # the adapter binds any free port itself
    explicit = load(["rollout.port=31234", "teacher=server", f"teacher.model_path={teacher_dir}", "teacher.port=7999"])
    assert with_free_ports(explicit) == explicit
    teacher = with_free_ports(load(["teacher=server", f"teacher.model_path={teacher_dir}"])).teacher.port
    assert isinstance(teacher, int) and teacher > 0
    assert with_free_rollout_port(load([]), engines=4).rollout.port != "auto"


@pytest.mark.parametrize("override,message", [
    ("rollout.port=autoo", "rollout.port: expected a TCP port in 1..65535, or auto (got 'autoo')"),
    ("rollout.port=-1", "rollout.port: must be a TCP port in 1..65535, or auto (got -1)"),
    ("teacher.port=65536", "teacher.port: must be a TCP port in 1..65535, or auto (got 65536)"),
    ("agent.port=auto0", "agent.port: expected a TCP port in 1..65535, or auto (got 'auto0')"),
])
def test_a_bad_port_is_a_config_error_saying_what_is_allowed(override: str, message: str) -> None:
    with pytest.raises(ConfigErrors) as caught:
        load([override])
    assert [e.render().split("\n")[0] for e in caught.value.errors] == [message]


def test_a_bad_port_exits_2_from_the_command_line() -> None:
    out = invoke_cli("config", "validate", "rollout.port=autoo")
    assert out.returncode == 2
    assert "rollout.port: expected a TCP port in 1..65535, or auto (got 'autoo')" in out.stderr
    assert "did you mean 'auto'?" in out.stderr


def test_auto_on_a_multi_node_run_is_the_agreed_port_every_node_computes(teacher_dir: Path) -> None:
    from slimecli.config.layout import engine_slots, teacher_urls

    cfg = load(["cluster.nnodes=2", f"run.dir={teacher_dir.parent}", "rollout.engines_per_node=1",
                "teacher=server", f"teacher.model_path={teacher_dir}", "teacher.every_node=true"])
    assert with_free_ports(cfg) == cfg  # nothing picked: the nodes could not learn it
    assert [s.port for s in engine_slots(cfg)] == [30000, 30001]
    assert teacher_urls(cfg) == ["http://127.0.0.1:7999", "http://127.0.0.1:8000"]


def launch(monkeypatch: pytest.MonkeyPatch, overrides: list[str], on_complete=None) -> str:
    """controller.run as `slimecli train` calls it, with its machine checks and its processes left out."""
    monkeypatch.setattr(controller, "materialize", lambda cfg: cfg)
    monkeypatch.setattr(controller, "check", lambda cfg: None)

    class Started:
        def __init__(self, *args, **kwargs) -> None:
            pass

        def run(self) -> int:
            return 0

    opened = []
    monkeypatch.setattr(controller, "Supervisor", Started)
    monkeypatch.setattr(controller, "prepare", lambda *a: opened.append(prepare(*a)) or opened[-1])
    console = Console(record=True, width=400, force_terminal=False)
    try:
        assert controller.run(load(overrides), ["slimecli", "train", *overrides], overrides, console=console,
                              on_complete=on_complete) == 0
    finally:
        for run in opened:  # the lock a real command holds until it exits
            if run.lock is not None:
                run.lock.release()
    return console.export_text()


def test_picked_ports_are_in_config_and_plan_and_a_resume_picks_its_own(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    overrides = [f"run.dir={tmp_path / 'run'}", "rollout.num_engines=2"]
    launch(monkeypatch, overrides)
    run = tmp_path / "run"
    port = load_frozen(run / "config.yaml").rollout.port
    plan = {spec["name"]: spec for spec in json.loads((run / "plan.json").read_text())}
    assert isinstance(port, int)
    assert plan["engine-0"]["ports"] == [port] and plan["engine-1"]["ports"] == [port + 1]
    assert plan["engine-1"]["probe"]["url"] == f"http://127.0.0.1:{port + 1}/health_generate"
    out = launch(monkeypatch, overrides)  # the resume: "auto" again, which is no change of the run
    assert "resuming" in out and "config changed" not in out
    assert isinstance(load_frozen(run / "config.yaml").rollout.port, int)


def test_a_complete_run_reports_that_nothing_ran(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from slimecli.checkpoint import store

    overrides = [f"run.dir={tmp_path / 'run'}", "trainer.max_steps=2"]
    complete: list[bool] = []
    launch(monkeypatch, overrides, on_complete=lambda: complete.append(True))
    assert complete == []  # it trained (its processes faked)
    store.save(tmp_path / "run", 2, {"w": torch.zeros(2, 2)}, optimizer_state=None, scheduler_state={},
               data_position={"offset": 2})
    out = launch(monkeypatch, overrides, on_complete=lambda: complete.append(True))
    assert "run complete: 2/2 steps done" in out and complete == [True]


def test_a_complete_run_summary_shows_no_wall_time_of_the_command(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The summary of a run found complete takes its wall time from its metrics (none here), not 0s."""
    import io

    from slimecli.cli.train import _summary

    (tmp_path / "run").mkdir()
    launch(monkeypatch, [f"run.dir={tmp_path / 'run'}"])
    out = io.StringIO()
    _summary(load([f"run.dir={tmp_path / 'run'}"]), Console(file=out, width=300), None, 0.0, [])
    assert "wall time" not in out.getvalue() and out.getvalue().startswith("run summary")


JUNK_REWARD = textwrap.dedent('''
    def score(sample):
        kind = sample.index % 4
        if kind == 0:
            return {"score": 1.0, "acc": True, "pred": sample.response[:5]}
        if kind == 1:
            return "not a number"
        if kind == 2:
            raise ValueError("this reward function fails on purpose")
        return {"acc": False}  # no reward.key in it
''')


def check_junk_rewards(run: Path, stdout: str) -> None:
    """What only a real run shows of `reward=python` with a reward that returns dicts, strings and raises: invalid
    rewards counted by reason in metrics.jsonl, the failing function's traceback once in the run log, and the
    invalid count on the progress line."""
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        quarter = row["reward/count"] / 4
        reasons = {k: v for k, v in row.items() if k.startswith("reward/invalid/")}
        assert row["reward/invalid/string"] == quarter and row["reward/invalid/reward_error"] == quarter
        assert len(reasons) == 3 and sum(reasons.values()) == 3 * quarter, reasons  # and the dict without score
        assert row["reward/invalid"] == 3 * quarter and row["reward/valid"] == quarter
        assert row["reward/mean"] == 1.0 and row["reward/key/score/mean"] == 1.0  # the valid ones only
        assert "reward/key/acc/mean" in row and "reward/key/pred/mean" not in row  # per-key means of dict rewards
    log = (run / "logs" / "trainer.log").read_text(errors="replace")
    assert log.count("ValueError: this reward function fails on purpose") == 1  # the traceback, once
    assert log.count("samples have no reward (metadata.reward_error): ValueError") >= 2  # a summary per scoring
    assert f"({int(rows[-1]['reward/invalid'] * 2)} invalid rewards so far)" in stdout  # the progress line


@pytest.mark.slow
def test_two_runs_started_together_on_default_ports_both_finish(tmp_path: Path) -> None:
    """Two runs at once on default ports, each also a test of its own so that it costs no start of its own:
    `reward=python` with a reward returning junk (Adam), and optimizer=stateless_adam, whose checkpoint then
    keeps no moments."""
    from slimecli.checkpoint import store

    reward = tmp_path / "my_reward.py"
    reward.write_text(JUNK_REWARD)
    runs = [tmp_path / "junk", tmp_path / "stateless"]
    argv = [sys.executable, "-m", "slimecli", "train", "trainer.max_steps=2", "trainer.nproc=1",
            "eval.at_start=false", "eval.at_end=false", "observe.report=false"]
    own = [["reward=python", f"reward.path={reward}:score", "reward.key=score"], ["optimizer=stateless_adam"]]
    procs = [subprocess.Popen([*argv, *overrides, f"run.dir={run}"], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for run, overrides in zip(runs, own, strict=True)]
    try:
        outputs = [proc.communicate(timeout=900)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out[-4000:]
    ports = [json.loads((run / "plan.json").read_text())[0]["ports"] for run in runs]
    assert ports[0] != ports[1] and all(isinstance(p, int) for pair in ports for p in pair)

    check_junk_rewards(runs[0], outputs[0])
    adam, stateless = (store.load(run) for run in runs)
    assert adam.step == 2 and adam.optimizer_state is not None and (adam.path / "optimizer.pt").is_file()
    assert stateless.step == 2 and stateless.optimizer_state is None
    assert not (stateless.path / "optimizer.pt").exists()
    assert stateless.metadata["optimizer"] == "stateless_adam"
