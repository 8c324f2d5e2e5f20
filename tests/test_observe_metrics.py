"""Metrics logger: exact JSON lines, flushed per step, TensorBoard scalars, never failing on odd values."""

from __future__ import annotations

import builtins
import json

import numpy as np
import torch

from slimecli.observe.metrics import MetricsLogger, as_number, read_metrics, scalars, to_json_value


def lines(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_lines_are_written_and_flushed_each_step(tmp_path):
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log(1, {"reward/mean": 0.25, "kl": torch.tensor(0.5), "tokens": np.int64(12), "lr": np.float32(0.125)})
    assert lines(tmp_path) == [  # readable before close: flushed
        {"step": 1, "time": lines(tmp_path)[0]["time"], "reward/mean": 0.25, "kl": 0.5, "tokens": 12, "lr": 0.125}]
    logger.log(2, {"loss": float("nan"), "reward": {"score": 1.0, "pred": "42"}, "note": "ok", "v": [1, torch.ones(2)],
                   "obj": object, "ok": True})
    logger.close()
    second = lines(tmp_path)[1]
    assert second["loss"] is None  # non-finite -> null, the file stays strict JSON
    assert second["reward"] == {"score": 1.0, "pred": "42"}
    assert second["note"] == "ok" and second["v"] == [1, [1.0, 1.0]] and second["ok"] is True
    assert second["obj"] == str(object)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_tensorboard_scalars_numeric_only(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(tmp_path) as logger:
        assert logger.tensorboard_enabled
        logger.log(3, {"reward": {"score": 0.75, "pred": "x"}, "kl": torch.tensor(0.5), "note": "text",
                       "big": torch.ones(3)})
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert tags == {"reward/score", "kl"}
    event = acc.Scalars("reward/score")[0]
    assert (event.step, event.value) == (3, 0.75)


def test_without_tensorboard_still_writes_json(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_tb(name, *args, **kwargs):
        if name.startswith("tensorboard"):
            raise ImportError("no tensorboard here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tb)
    with MetricsLogger(tmp_path) as logger:
        assert not logger.tensorboard_enabled
        logger.log(1, {"x": 1.5})
    assert lines(tmp_path)[0]["x"] == 1.5


def test_resume_drops_steps_after_the_checkpoint(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        for step in (1, 2, 3):
            logger.log(step, {"x": step})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "x"')  # cut by a kill
    with MetricsLogger(tmp_path, tensorboard=False, resume_step=2) as logger:
        logger.log(3, {"x": 30})
    assert [(r["step"], r["x"]) for r in lines(tmp_path)] == [(1, 1), (2, 2), (3, 30)]


def test_value_helpers():
    assert as_number(np.float64(2.5)) == 2.5 and as_number(torch.tensor([4])) == 4.0
    assert as_number("3") is None and as_number({"a": 1}) is None and as_number(torch.ones(2)) is None
    assert to_json_value(float("inf")) is None
    assert dict(scalars({"a": {"b": 1, "c": "no"}, "d": None, "e": 2})) == {"a/b": 1.0, "e": 2.0}
