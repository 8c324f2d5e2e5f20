"""teacher.backend=megatron: the teacher server with a megatron-core, tensor-parallel model body (CPU, gloo).

The same HTTP API as the torch back-end; at teacher.tp=2 each rank holds half of every attention and MLP
matrix and of the output layer. Its log-probs must equal teacher.tp=1's and a plain full-vocabulary HF forward's.
"""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from tests.helpers import ROOT
from tests.helpers.teacher import VOCAB, Server, make_checkpoint, reference_log_probs

pytest.importorskip("megatron.core")

ATOL = 1e-4
IDS = [1, 5, 7, 9, 1000, 3, 42, 77]
LABELS = [[5, 6, 1000], [7, 8, 0], [9, 1, 2], [1000, 4, 5], [3, 3, 999], [42, 0, 1], [77, 2, 3]]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("megatron_teacher_ckpt")
    return make_checkpoint(tmp / "m1", seed=1), make_checkpoint(tmp / "m2", seed=2)


def _serve(tmp, ckpt, tp: int) -> Server:
    srv = Server(tmp, [f"teacher.model_path={ckpt}", f"teacher.tp={tp}", "teacher.backend=megatron"])
    srv.wait_ready(timeout=300)
    return srv


@pytest.fixture(scope="module")
def servers(tmp_path_factory, ckpts):
    tmp = tmp_path_factory.mktemp("megatron_teacher")
    started: list[Server] = []
    try:
        started.append(_serve(tmp, ckpts[0], 1))
        started.append(_serve(tmp, ckpts[0], 2))
        yield {1: started[0], 2: started[1]}
    finally:
        for srv in started:
            srv.stop()


def score(srv: Server, temperature: float = 1.0) -> dict:
    r = httpx.post(srv.url + "/generate", json={"input_ids": IDS, "sample_n": 3, "label_token_ids": LABELS,
                                                "temperature": temperature}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_tp2_equals_tp1_and_the_hf_reference(servers, ckpts, temperature):
    ref = reference_log_probs(ckpts[0], IDS, temperature)
    one, two = score(servers[1], temperature), score(servers[2], temperature)
    for i in range(len(IDS) - 1):
        expected = float(ref[i, IDS[i + 1]])
        assert abs(one["log_probs"][i] - expected) < ATOL
        assert abs(two["log_probs"][i] - one["log_probs"][i]) < ATOL
        for j, tok in enumerate(LABELS[i]):
            assert abs(two["label_token_log_probs"][i][j] - one["label_token_log_probs"][i][j]) < ATOL
            assert abs(two["label_token_log_probs"][i][j] - float(ref[i, tok])) < ATOL
        for tok, logp in zip(two["sampled_token_ids"][i], two["sampled_log_probs"][i], strict=True):
            assert 0 <= tok < VOCAB  # the padding row (VOCAB is odd, tp=2 pads it) is never sampled
            assert abs(logp - float(ref[i, tok])) < ATOL


def test_megatron_ranks_say_so_and_update_weights(servers, ckpts):
    srv = servers[2]
    log = srv.read_log()
    assert "megatron-core runs on the CPU" in log  # the CPU shim announces itself
    r = httpx.post(srv.url + "/update_weights_from_disk", json={"model_path": str(ckpts[1])}, timeout=300)
    assert r.status_code == 200, r.text
    ref = reference_log_probs(ckpts[1], IDS)
    out = score(srv)
    for i in range(len(IDS) - 1):
        assert abs(out["log_probs"][i] - float(ref[i, IDS[i + 1]])) < ATOL
    r = httpx.post(srv.url + "/update_weights_from_disk", json={"model_path": str(ckpts[0])}, timeout=300)
    assert r.status_code == 200, r.text


def test_heads_that_do_not_split_are_refused_before_launch(ckpts, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "slimecli", "teacher", "serve", f"teacher.model_path={ckpts[0]}",
                           "teacher.backend=megatron", "teacher.tp=3", f"run.dir={tmp_path / 'run'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "teacher.tp" in proc.stderr and "num_attention_heads=4" in proc.stderr
    assert "Traceback" not in proc.stderr
