"""update_weights_from_disk: the trainer's own export is copied into the served model in place; a checkpoint
that differs in config or tensors is left to the whole load (and then served as that whole model)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from slimecli.engine.disk_update import _in_place
from slimecli.model.loading import load_model
from slimecli.model.tiny import create_tiny_model


def served(path: Path) -> SimpleNamespace:
    """What _in_place reads of an EngineServer: its scheduler's runner, serving the model at ``path``."""
    model = load_model(path)
    return SimpleNamespace(_sched=SimpleNamespace(runner=SimpleNamespace(model=model, device=torch.device("cpu"))),
                           weight_routes=SimpleNamespace(segment=None), same_config=None)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("disk-update")
    return create_tiny_model(root / "a", seed=0), create_tiny_model(root / "b", seed=1)


def test_same_architecture_is_copied_in_place(models: tuple[Path, Path]) -> None:
    first, second = models
    server = served(first)
    model = server._sched.runner.model
    install = _in_place(server, str(second))
    assert install is not None
    ids = torch.tensor([[5, 6, 7, 8]])
    install(model)
    expected = load_model(second)
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, expected(ids).logits, atol=1e-6)
    # the tied output layer follows the embedding it shares storage with
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert torch.equal(model.lm_head.weight, expected.lm_head.weight)


def test_weights_served_from_a_shared_segment_are_not_overwritten(models: tuple[Path, Path]) -> None:
    server = served(models[0])
    server.weight_routes.segment = object()  # the trainer's segment (trainer.weight_sync=shared_memory)
    assert _in_place(server, str(models[1])) is None


def test_a_different_config_is_loaded_whole(models: tuple[Path, Path], tmp_path: Path) -> None:
    first, second = models
    changed = tmp_path / "eps"
    changed.mkdir()
    for f in second.iterdir():
        (changed / f.name).write_bytes(f.read_bytes())
    config = json.loads((changed / "config.json").read_text())
    config["rms_norm_eps"] = 1e-3  # the same tensors, but not the same computation
    (changed / "config.json").write_text(json.dumps(config))
    server = served(first)
    assert _in_place(server, str(second)) is not None  # a match is remembered for that config.json...
    assert _in_place(server, str(changed)) is None  # ...and only for it
    assert _in_place(server, str(second)) is not None
    server._sched.runner.model.config = type(server._sched.runner.model.config)(**config)  # another model swapped in
    assert _in_place(server, str(second)) is None


@pytest.mark.parametrize("edit", ["missing", "extra", "shape"])
def test_tensors_that_differ_are_loaded_whole(models: tuple[Path, Path], tmp_path: Path, edit: str) -> None:
    first, second = models
    out = tmp_path / edit
    out.mkdir()
    for f in second.iterdir():
        if f.suffix != ".safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    tensors = load_file(second / "model.safetensors")
    name = next(n for n in tensors if n.endswith("mlp.up_proj.weight"))
    if edit == "missing":
        del tensors[name]
    elif edit == "extra":
        tensors["model.extra.weight"] = torch.zeros(2)
    else:
        tensors[name] = torch.zeros(3, 3)
    save_file(tensors, str(out / "model.safetensors"))
    server = served(first)
    before = {k: v.clone() for k, v in server._sched.runner.model.state_dict().items()}
    assert _in_place(server, str(out)) is None
    after = server._sched.runner.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing was touched on the way


def test_no_weights_file_is_loaded_whole(models: tuple[Path, Path], tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((models[1] / "config.json").read_text())
    assert _in_place(served(models[0]), str(tmp_path)) is None
