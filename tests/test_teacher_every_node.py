"""teacher.every_node: a teacher server on every node of a multi-node run, node k's on teacher.port + k at its
address, and trainer rank 0 spreading its samples over all of them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from slimecli.config.compose import load
from slimecli.config.errors import ConfigErrors
from slimecli.config.layout import teacher_urls
from slimecli.launch.plan import build_plan
from slimecli.rollout.sample import Sample
from slimecli.teacher.client import TeacherPool
from tests.helpers.teacher import Server, make_checkpoint, reference_log_probs

TWO_NODES = ["cluster.nnodes=2", "cluster.node_hosts=[127.0.0.1,127.0.0.2]", "teacher=server", "teacher.port=7000"]


def teacher_probe(cfg, tmp_path: Path) -> str | None:
    spec = next((s for s in build_plan(cfg, tmp_path) if s.name == "teacher"), None)
    return None if spec is None else spec.probe.url


def test_layout_and_plan(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "t", seed=1)
    common = [*TWO_NODES, f"teacher.model_path={ckpt}", f"run.dir={tmp_path / 'run'}"]
    once = [load([*common, f"cluster.node_rank={k}"]) for k in (0, 1)]
    assert teacher_urls(once[0]) == ["http://127.0.0.1:7000"]
    assert teacher_probe(once[0], tmp_path) == "http://127.0.0.1:7000/healthz"
    assert teacher_probe(once[1], tmp_path) is None  # by default the teacher runs on node 0 only
    every = [load([*common, "teacher.every_node=true", f"cluster.node_rank={k}"]) for k in (0, 1)]
    assert teacher_urls(every[1]) == ["http://127.0.0.1:7000", "http://127.0.0.2:7001"]
    assert teacher_probe(every[0], tmp_path) == "http://127.0.0.1:7000/healthz"
    assert teacher_probe(every[1], tmp_path) == "http://127.0.0.2:7001/healthz"  # its own node's address
    remote = load([*TWO_NODES, "teacher.url=http://10.0.0.9:8000", f"run.dir={tmp_path / 'run'}"])
    assert teacher_urls(remote) == ["http://10.0.0.9:8000"] and teacher_probe(remote, tmp_path) is None


def test_preflight_checks_the_port_of_this_nodes_teacher(tmp_path: Path) -> None:
    import socket

    from slimecli.launch.preflight import server_errors
    from slimecli.net.ports import free_port

    ckpt = make_checkpoint(tmp_path / "t", seed=1)
    port = free_port()
    cfg = load(["cluster.nnodes=2", "cluster.node_rank=1", "teacher=server", f"teacher.model_path={ckpt}",
                f"teacher.port={port - 1}", "teacher.every_node=true", f"run.dir={tmp_path / 'run'}"])
    assert not [e for e in server_errors(cfg) if e.path == "teacher.port"]
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))  # node 1's teacher port: teacher.port + 1
        held.listen()
        errors = [e for e in server_errors(cfg) if e.path == "teacher.port"]
    assert errors and str(port) in str(errors[0])


def test_every_node_needs_a_launched_teacher() -> None:
    with pytest.raises(ConfigErrors) as exc:
        load(["teacher=server", "teacher.url=http://127.0.0.1:9", "teacher.every_node=true"])
    assert [e.path for e in exc.value.errors] == ["teacher.every_node"]
    assert "teacher.url" in str(exc.value)


@pytest.mark.slow
def test_rank0_spreads_samples_over_every_nodes_teacher(tmp_path: Path) -> None:
    """Node 0's and node 1's servers as `teacher serve` starts them on their node (here two checkpoints, so
    the scores say which server answered): sample i goes to server i mod 2."""
    ckpts = [make_checkpoint(tmp_path / f"t{k}", seed=10 + k) for k in (0, 1)]
    servers = []
    for node, ckpt in enumerate(ckpts):
        srv = Server(tmp_path, ["teacher=server", f"teacher.model_path={ckpt}", "teacher.every_node=true", "cluster.nnodes=2",
                                f"cluster.node_rank={node}"])
        srv.url = f"http://127.0.0.1:{srv.port + node}"  # node k listens on teacher.port + k
        servers.append(srv)
    try:
        for srv in servers:
            srv.wait_ready()
        cfg = load(["teacher=server", f"teacher.model_path={ckpts[0]}"])
        samples = [Sample(index=i, tokens=[3 + i, 7, 11, 13 + i, 17], response_length=2) for i in range(4)]

        async def score() -> list[list[float]]:
            pool = TeacherPool(cfg.teacher, [s.url for s in servers])
            try:
                return await pool.score(samples)
            finally:
                await pool.close()

        scores = asyncio.run(score())
        for i, sample in enumerate(samples):
            ref = reference_log_probs(ckpts[i % 2], sample.tokens)
            expected = ref[torch.arange(2, 4), torch.tensor(sample.tokens[3:])].tolist()
            assert scores[i] == pytest.approx(expected, abs=1e-4), f"sample {i}"
    finally:
        for srv in servers:
            srv.stop()
