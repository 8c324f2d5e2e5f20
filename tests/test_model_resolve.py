"""model=tiny is made once per parameter set in the cache dir; model.path is used as given; `slimecli model init`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from slimecli.config.compose import load
from slimecli.model.loading import load_model, load_tokenizer, resolve_model_path
from tests.helpers import ROOT, invoke_cli


def test_path_is_returned_as_is(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    cfg = load([f"model.path={tmp_path}"])
    assert resolve_model_path(cfg.model) == tmp_path


def test_tiny_is_made_once_and_reused(tmp_path: Path) -> None:
    cfg = load([f"model.cache_dir={tmp_path}", "model.seed=7"])
    path = resolve_model_path(cfg.model)
    assert path.parent == tmp_path and path.name.startswith("tiny-")
    assert json.loads((path / "slimecli_tiny.json").read_text())["seed"] == 7
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_path(cfg.model) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    other = resolve_model_path(load([f"model.cache_dir={tmp_path}", "model.seed=8"]).model)
    assert other != path
    assert load_model(path).config.model_type == "qwen3"
    assert load_tokenizer(path).eos_token == "<|im_end|>"
    assert not [p for p in tmp_path.iterdir() if p.is_dir() and p.name.startswith(".")]  # no temp dirs left


def test_concurrent_makers_agree(tmp_path: Path) -> None:
    code = ("import sys; from slimecli.config.compose import load; from slimecli.model.loading import "
            "resolve_model_path; print(resolve_model_path(load([f'model.cache_dir={sys.argv[1]}']).model))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}) for _ in range(3)]
    outs = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(outs) == 1
    made = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert [str(p) for p in made] == list(outs)


def test_cli_model_init(tmp_path: Path) -> None:
    out = tmp_path / "m"
    res = invoke_cli("model", "init", str(out), "--seed", "3")
    assert res.returncode == 0, res.stderr
    assert (out / "config.json").exists() and (out / "tokenizer.json").exists()
    assert json.loads((out / "slimecli_tiny.json").read_text())["seed"] == 3
    again = invoke_cli("model", "init", str(out))
    assert again.returncode == 2 and "not an empty directory" in again.stderr
