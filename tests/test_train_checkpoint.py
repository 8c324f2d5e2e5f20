"""Checkpoints: round trip, atomicity (half-written dirs ignored), retention, RNG restore."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from slimecli.checkpoint import store as C
from slimecli.checkpoint.rng import restore_rng


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(8, 4)
        self.body = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 8, bias=False)
        self.head.weight = self.embed.weight  # tied, as in small HF decoders


def trained() -> tuple[Tied, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(0)
    model = Tied()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
    for _ in range(2):
        model.head(model.body(model.embed(torch.tensor([1, 2])))).sum().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    return model, opt, sched


def test_round_trip_restores_model_optimizer_scheduler_and_data(tmp_path):
    model, opt, sched = trained()
    path = C.save(tmp_path, 5, model.state_dict(), optimizer_state=opt.state_dict(),
                  scheduler_state=sched.state_dict(), data_position={"epoch": 1, "offset": 17},
                  metadata={"optimizer": "adamw"})
    assert path == tmp_path / "checkpoints" / "step_5"
    assert sorted(p.name for p in path.iterdir()) == ["COMPLETE", "manifest.json", "meta.json", "model.safetensors",
                                                      "optimizer.pt", "rng.pt", "scheduler.pt"]
    ck = C.load(tmp_path)  # a run dir resolves to its latest complete checkpoint
    assert ck.step == 5 and ck.path == path
    assert ck.data_position == {"epoch": 1, "offset": 17} and ck.metadata == {"optimizer": "adamw"}
    fresh = Tied()
    fresh.load_state_dict(ck.model_state)  # strict: the tied alias is present
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert fresh.head.weight is fresh.embed.weight
    opt2 = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: min(1.0, (s + 1) / 3))  # build both, then load
    opt2.load_state_dict(ck.optimizer_state)
    sched2.load_state_dict(ck.scheduler_state)
    assert sched2.last_epoch == 2 and opt2.param_groups[0]["lr"] == pytest.approx(1e-2)
    state_a = opt.state_dict()["state"][0]
    state_b = opt2.state_dict()["state"][0]
    assert torch.equal(state_a["exp_avg"], state_b["exp_avg"]) and int(state_b["step"]) == 2


def test_optimizer_state_none_is_skipped(tmp_path):
    path = C.save(tmp_path, 1, {"w": torch.ones(2)}, optimizer_state=None)
    assert not (path / "optimizer.pt").exists()
    ck = C.load(path)
    assert ck.optimizer_state is None and ck.scheduler_state is None
    assert torch.equal(ck.model_state["w"], torch.ones(2))


def test_half_written_dirs_are_ignored(tmp_path):
    C.save(tmp_path, 3, {"w": torch.full((2,), 3.0)})
    root = tmp_path / "checkpoints"
    # a kill after the rename but without a marker, and a kill inside the temp dir
    (root / "step_5").mkdir()
    (root / "step_5" / "model.safetensors").write_bytes(b"partial")
    (root / ".tmp-step_6-123").mkdir()
    (root / "step_notanumber").mkdir()
    assert C.latest_complete(tmp_path) == root / "step_3"
    assert torch.equal(C.load(tmp_path).model_state["w"], torch.full((2,), 3.0))
    with pytest.raises(FileNotFoundError, match="COMPLETE"):
        C.load(root / "step_5")
    C.save(tmp_path, 4, {"w": torch.zeros(2)}, keep=2)
    assert not (root / ".tmp-step_6-123").exists()  # stale temp dirs are cleaned by the next save
    assert C.latest_complete(tmp_path) == root / "step_4"


def test_failure_while_writing_leaves_no_checkpoint(tmp_path, monkeypatch):
    C.save(tmp_path, 1, {"w": torch.ones(1)})

    def boom(obj, path):
        raise OSError("disk full")

    monkeypatch.setattr(C, "_torch_save", boom)
    with pytest.raises(OSError, match="disk full"):
        C.save(tmp_path, 2, {"w": torch.zeros(1)}, optimizer_state={"state": {}, "param_groups": []})
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_1"]
    assert C.latest_complete(tmp_path).name == "step_1"


def test_no_checkpoint(tmp_path):
    assert C.latest_complete(tmp_path) is None
    with pytest.raises(FileNotFoundError):
        C.load(tmp_path)


def test_keeps_the_last_n_and_replaces_a_resaved_step(tmp_path):
    for step in range(1, 5):
        C.save(tmp_path, step, {"w": torch.full((1,), float(step))}, keep=2)
    assert [s for s, _ in C.step_dirs(tmp_path)] == [3, 4]
    C.save(tmp_path, 4, {"w": torch.full((1,), 40.0)}, keep=2)
    assert C.load(tmp_path).model_state["w"].item() == 40.0
    for step in range(5, 8):
        C.save(tmp_path, step, {"w": torch.zeros(1)}, keep=0)  # 0 keeps everything
    assert [s for s, _ in C.step_dirs(tmp_path)] == [3, 4, 5, 6, 7]


def test_rng_restore_reproduces_the_same_numbers(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.normal()  # leave numpy with a cached gaussian half
    path = C.save(tmp_path, 1, {"w": torch.ones(1)})
    first = (random.random(), np.random.normal(), np.random.rand(3).tolist(), torch.rand(3).tolist())
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    restore_rng(C.load(path).rng)
    again = (random.random(), np.random.normal(), np.random.rand(3).tolist(), torch.rand(3).tolist())
    assert again == first
