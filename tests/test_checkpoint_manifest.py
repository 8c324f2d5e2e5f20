"""Checkpoint manifests: a checkpoint counts only when every file it lists is there with its size and hash;
a damaged one is skipped with a warning naming it and the previous one is used, or, with none left, the
error names the damaged file."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from slimecli.checkpoint import layout as L
from slimecli.checkpoint import manifest as M
from slimecli.checkpoint import store as C


def save(run, step, *, optimizer=True, keep=0):
    torch.manual_seed(step)
    model = {"w": torch.randn(4, 4), "b": torch.randn(4)}
    opt = {"state": {0: {"exp_avg": torch.randn(4, 4)}}, "param_groups": [{"lr": 1e-3, "params": [0]}]}
    return C.save(run, step, model, optimizer_state=opt if optimizer else None,
                  scheduler_state={"last_epoch": step}, data_position={"offset": step}, keep=keep)


def overwrite_middle(path):
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 8] = b"\xde\xad\xbe\xef" * 2
    path.write_bytes(bytes(data))


def test_the_manifest_lists_every_file_with_size_and_hash(tmp_path):
    path = save(tmp_path, 1)
    files = json.loads((path / L.MANIFEST).read_text())["files"]
    on_disk = {p.name for p in path.iterdir()} - {L.MANIFEST, L.COMPLETE}
    assert set(files) == on_disk == {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng.pt", "meta.json"}
    for name, entry in files.items():
        assert entry["size"] == (path / name).stat().st_size and len(entry["sha256"]) == 64
    assert C.latest_complete(tmp_path) == path


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "rng.pt", "meta.json", "model.safetensors"])
def test_a_deleted_file_makes_the_previous_checkpoint_the_resume_point(tmp_path, caplog, name):
    first, second = save(tmp_path, 1), save(tmp_path, 2)
    (second / name).unlink()  # the COMPLETE marker is kept
    with caplog.at_level(logging.WARNING):
        assert C.latest_complete(tmp_path) == first
    assert f"checkpoint {second} is damaged ({name} is missing); skipped" in caplog.text
    assert f"resuming from the previous complete checkpoint {first}" in caplog.text
    assert C.load(tmp_path).step == 1


@pytest.mark.parametrize("damage", ["garbage_same_size", "truncated", "appended", "header"])
def test_a_corrupt_model_file_is_skipped(tmp_path, caplog, damage):
    save(tmp_path, 1)
    second = save(tmp_path, 2)
    model = second / "model.safetensors"
    if damage == "garbage_same_size":
        overwrite_middle(model)
    elif damage == "truncated":
        model.write_bytes(model.read_bytes()[:-10])
    elif damage == "appended":
        model.write_bytes(model.read_bytes() + b"junk")
    else:
        model.write_bytes(b"\x00" * model.stat().st_size)
    with caplog.at_level(logging.WARNING):
        assert C.load(tmp_path).step == 1
    assert f"checkpoint {second} is damaged (model.safetensors " in caplog.text


def test_with_no_usable_checkpoint_left_the_error_names_the_file(tmp_path):
    only = save(tmp_path, 1)
    overwrite_middle(only / "optimizer.pt")
    with pytest.raises(M.CheckpointDamaged) as info:
        C.latest_complete(tmp_path)
    assert f"{only}: optimizer.pt does not match its recorded SHA-256" in str(info.value)
    with pytest.raises(M.CheckpointDamaged):
        C.load(tmp_path)


def test_no_checkpoint_at_all_is_not_an_error(tmp_path):
    assert C.latest_complete(tmp_path) is None
    (tmp_path / "checkpoints" / ".tmp-step_3-1").mkdir(parents=True)  # half-written, no marker
    assert C.latest_complete(tmp_path) is None


def test_a_checkpoint_without_a_manifest_loads_with_a_warning(tmp_path, caplog):
    path = save(tmp_path, 1)
    (path / L.MANIFEST).unlink()  # as written before manifests existed
    with caplog.at_level(logging.WARNING):
        assert C.load(tmp_path).step == 1
    assert f"checkpoint {path} has no manifest.json (written by an older slimecli)" in caplog.text


def test_an_old_checkpoint_that_cannot_be_loaded_falls_back_when_loading(tmp_path, caplog):
    """Damage a manifest cannot show (no manifest, garbage optimizer state): the loader itself falls back."""
    first, second = save(tmp_path, 1), save(tmp_path, 2)
    (second / L.MANIFEST).unlink()
    (second / "optimizer.pt").write_bytes(b"not a pickle at all")
    with caplog.at_level(logging.WARNING):
        ckpt = C.load(second)
    assert ckpt.step == 1 and ckpt.path == first
    assert f"checkpoint {second} is damaged (optimizer.pt: " in caplog.text
    (first / "rng.pt").write_bytes(b"garbage")
    (first / L.MANIFEST).unlink()
    with pytest.raises(M.CheckpointDamaged) as info:
        C.load(second)
    assert "rng.pt" in str(info.value) and "optimizer.pt" in str(info.value)


def test_big_files_are_hashed_over_samples(tmp_path, monkeypatch):
    monkeypatch.setattr(M, "FULL_HASH_BYTES", 1024)
    monkeypatch.setattr(M, "SAMPLE_BYTES", 64)
    first = save(tmp_path, 1)
    second = C.save(tmp_path, 2, {"w": torch.zeros(64, 64)}, keep=0)  # 16 KiB of tensor data
    entry = json.loads((second / L.MANIFEST).read_text())["files"]["model.safetensors"]
    assert entry["sha256"].startswith("sampled:")
    model = second / "model.safetensors"
    data = bytearray(model.read_bytes())
    data[-10:] = b"\x01" * 10  # the tail block is always sampled
    model.write_bytes(bytes(data))
    assert C.latest_complete(tmp_path) == first


def test_megatron_rank_shards_are_covered(tmp_path):
    """Whatever the back-end puts in the optimizer state (megatron: one entry per rank) is in a listed file,
    and any file a checkpoint holds is listed."""
    state = {"megatron_ranks": [{"rank": r, "exp_avg": torch.randn(8)} for r in range(2)]}
    path = C.save(tmp_path, 1, {"w": torch.randn(2)}, optimizer_state=state, keep=0)
    assert "optimizer.pt" in json.loads((path / L.MANIFEST).read_text())["files"]
    assert [s["rank"] for s in C.load(path).optimizer_state["megatron_ranks"]] == [0, 1]


def test_pruning_does_not_keep_a_damaged_checkpoint_instead_of_a_good_one(tmp_path):
    save(tmp_path, 1, keep=1)
    damaged = save(tmp_path, 5, keep=1)
    (damaged / "rng.pt").unlink()
    good = save(tmp_path, 2, keep=1)  # a resumed run saving again from an earlier step
    assert good.is_dir() and C.latest_complete(tmp_path) == good
