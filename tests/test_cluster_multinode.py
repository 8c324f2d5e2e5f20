"""Two "nodes" on one machine: two `slimecli train` controllers with node ranks 0 and 1 on loopback, sharing a
run directory, each starting its own engine and trainer rank; one torchrun rendezvous between them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from slimecli.config.compose import load
from slimecli.config.errors import ConfigErrors
from slimecli.config.layout import engine_slot, engine_slots, node_dir, run_dir_of
from slimecli.launch.plan import build_plan
from tests.helpers import ROOT, free_port, wait_until
from tests.helpers.train_e2e import cmdline, descendants, kill_tree, metrics


def node_args(run: Path, rank: int, master_port: int, engine_port: int, *extra: str) -> list[str]:
    """Node ``rank``'s `slimecli train`: the same command on both nodes but for the node rank."""
    return [sys.executable, "-m", "slimecli", "train", f"run.dir={run}", f"rollout.port={engine_port}",
            "cluster.nnodes=2", f"cluster.node_rank={rank}", f"cluster.master_port={master_port}",
            "cluster.node_hosts=[127.0.0.1,127.0.0.1]", "rollout.engines_per_node=1", "trainer.nproc=1",
            "eval.at_start=false", "eval.at_end=false", "observe.report=false", *extra]


def start_node(argv: list[str], log: Path) -> subprocess.Popen:
    """Output to a file: a pipe nobody reads until the end would block a controller that prints a lot."""
    with open(log, "w") as out:
        return subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)


def test_layout_puts_engines_on_every_node_and_node_files_in_their_own_directory(tmp_path: Path):
    cfg = load(["cluster.nnodes=2", "cluster.node_rank=1", "cluster.node_hosts=[10.0.0.1,10.0.0.2]",
                "rollout.engines_per_node=2", "rollout.port=31000", f"run.dir={tmp_path}"])
    assert [(s.index, s.node, s.url) for s in engine_slots(cfg)] == [
        (0, 0, "http://10.0.0.1:31000"), (1, 0, "http://10.0.0.1:31001"),
        (2, 1, "http://10.0.0.2:31002"), (3, 1, "http://10.0.0.2:31003")]
    node1 = node_dir(tmp_path, 1)
    assert node1 == tmp_path / "nodes" / "1" and node_dir(tmp_path, 0) == tmp_path
    assert run_dir_of(node1 / "config.yaml") == tmp_path.resolve()
    plan = build_plan(cfg, node1)
    assert [s.name for s in plan] == ["engine-2", "engine-3", "trainer"]  # node 1's engines only, no teacher
    trainer = plan[-1]
    assert ["--node-rank", "1"] == trainer.argv[trainer.argv.index("--node-rank"):][:2]
    assert str(node1 / "config.yaml") in trainer.argv
    assert all(s.env["SLIMECLI_RUN_DIR"] == str(tmp_path.resolve()) for s in plan)  # engines load RUN/weights
    c10d = build_plan(load(["cluster.nnodes=2", "cluster.rdzv_backend=c10d", f"run.dir={tmp_path}"]), tmp_path)
    assert "--rdzv-endpoint" in c10d[-1].argv and "--node-rank" not in c10d[-1].argv
    single = load(["rollout.port=30000"])
    assert [s.url for s in engine_slots(single)] == ["http://127.0.0.1:30000"]
    assert engine_slot(single, 3).url == "http://127.0.0.1:30003"  # an engine started by hand with --index 3


def test_bad_cluster_layouts_are_config_errors():
    with pytest.raises(ConfigErrors) as exc:
        load(["cluster.nnodes=2", "cluster.node_hosts=[a]", "rollout.engines_per_node=-1", "run.dir=/tmp/x"])
    text = str(exc.value)
    assert "cluster.node_hosts" in text and "rollout.engines_per_node" in text


@pytest.mark.slow
def test_two_nodes_train_together_and_a_dead_node_stops_both_then_the_same_commands_resume(tmp_path: Path):
    run = tmp_path / "shared"
    master, engines = free_port(), free_port()
    args = ("trainer.max_steps=6", "trainer.save_interval=1")
    argv = [node_args(run, rank, master, engines, *args) for rank in (0, 1)]
    nodes = [start_node(a, tmp_path / f"node{rank}-first.log") for rank, a in enumerate(argv)]
    try:
        wait_until(lambda: len(metrics(run)) >= 2, 400, "two steps on two nodes", proc=nodes[0])
        node1_children = descendants(nodes[1].pid)
        assert any(b"slimecli.engine" in cmdline(p) for p in node1_children)  # node 1 serves an engine
        nodes[1].send_signal(signal.SIGKILL)  # node 1's controller dies: its engine and trainer rank follow
        nodes[1].wait()
        code = nodes[0].wait(timeout=180)  # node 0 notices through the rendezvous / its engine link, and stops
        out0 = (tmp_path / "node0-first.log").read_text()
    finally:
        for proc in nodes:
            if proc.poll() is None:
                kill_tree(proc)
            else:
                for pid in descendants(proc.pid):
                    os.kill(pid, signal.SIGKILL)
    assert code != 0, out0[-3000:]
    assert "trainer failed" in out0, out0[-3000:]  # one line: which process, why, where its log is
    done = len(metrics(run))
    assert 2 <= done < 6
    nodes = [start_node(a, tmp_path / f"node{rank}.log") for rank, a in enumerate(argv)]  # the same commands
    try:
        codes = [proc.wait(timeout=400) for proc in nodes]
        outs = [(tmp_path / f"node{rank}.log").read_text() for rank in (0, 1)]
    finally:
        for proc in nodes:
            if proc.poll() is None:
                kill_tree(proc)
    assert codes == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    assert "resuming" in outs[0]
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4, 5, 6]
    logs = run / "nodes" / "1" / "logs"
    assert (logs / "engine-1.log").is_file() and (logs / "trainer.log").is_file()
    # rank 0's pushes reached node 1's engine: after the resume it served every weight version trained, the last too
    served = re.findall(r"weights updated from .*\(weight_version=(\d+)\)", (logs / "engine-1.log").read_text())
    assert served and served[-1] == "6", served
    assert {str(step) for step in range(done + 1, 7)} <= set(served), served
