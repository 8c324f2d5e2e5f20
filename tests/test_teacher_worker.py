"""The teacher rank's own guards: what every rank can decide from the message alone is a 400 before any
collective (so a TP group never splits on bad input), and logits / temperature must stay finite."""

from __future__ import annotations

import pytest

from slimecli.teacher.ranks import handle
from slimecli.teacher.worker import RequestInvalid, TeacherWorker
from tests.helpers.teacher import VOCAB, make_checkpoint


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    w = TeacherWorker(tp=1, tp_rank=0, group=None)
    w.load(str(make_checkpoint(tmp_path_factory.mktemp("worker") / "m", seed=3)))
    return w


@pytest.mark.parametrize("kwargs, message", [
    ({"input_ids": [1]}, "at least 2 tokens"),
    ({"input_ids": [1, VOCAB]}, "token ids in [0,"),
    ({"input_ids": [1, 2], "temperature": float("nan")}, "finite number > 0"),
    ({"input_ids": [1, 2], "temperature": 0.0}, "finite number > 0"),
    ({"input_ids": [1, 2], "sample_n": -1}, "sample_n"),
    ({"input_ids": [1, 2, 3], "labels": [[1]]}, "one row per position"),
    ({"input_ids": [1, 2], "labels": [[VOCAB]]}, "label_token_ids must be token ids"),
    ({"input_ids": [1, 2, 3], "temperature": 1e-40}, "too small for this model's logits"),
])
def test_bad_requests_are_refused_alike_on_every_rank(worker, kwargs, message):
    with pytest.raises(RequestInvalid, match=message.replace("[", r"\[")):
        worker.score(**kwargs)
    assert worker.in_collective is False


def test_a_refusal_is_a_400_reply_and_the_worker_keeps_serving(worker):
    bad = handle(worker, {"op": "score", "input_ids": [1, 2, 3], "sample_n": 0, "labels": None,
                          "temperature": 1e-40})
    assert bad["ok"] is False and bad["status"] == 400 and "temperature" in bad["error"]
    good = handle(worker, {"op": "score", "input_ids": [1, 2, 3], "sample_n": 2, "labels": [[0], [1]],
                           "temperature": 1.0})
    assert good["ok"] is True and len(good["result"]["log_probs"]) == 2
    assert all(lp <= 0 for lp in good["result"]["log_probs"])
