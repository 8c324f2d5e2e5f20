"""The compose cache: the same inputs give the same config without composing again; any input that changes, a
composition with errors and an interpolation on the command line compose afresh."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from slimecli.config import compose as c
from slimecli.config.io import dump_yaml
from slimecli.launch import compose_cache as cc
from slimecli.launch.source_checks import load


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "cache"
    monkeypatch.setenv(cc.CACHE_ENV, str(where))
    return where


def counting(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """compose_dict's calls, recorded (it still composes)."""
    calls: list[list[str]] = []
    real = c.compose_dict

    def compose_dict(overrides: list[str], *args: Any) -> Any:
        calls.append(list(overrides))
        return real(overrides, *args)
    monkeypatch.setattr(c, "compose_dict", compose_dict)
    return calls


def test_the_same_inputs_are_composed_once_and_give_the_same_config(cache: Path, monkeypatch: pytest.MonkeyPatch
                                                                    ) -> None:
    calls = counting(monkeypatch)
    first = load(["+recipe=swe_agent", "optimizer.lr=2e-6"])
    again = load(["+recipe=swe_agent", "optimizer.lr=2e-6"])
    assert len(calls) == 1 and len(list(cache.glob("*.json"))) == 1
    assert dump_yaml(again) == dump_yaml(first)
    monkeypatch.setenv(cc.CACHE_ENV, "off")
    assert dump_yaml(load(["+recipe=swe_agent", "optimizer.lr=2e-6"])) == dump_yaml(first)  # as composed afresh
    load(["+recipe=swe_agent", "optimizer.lr=3e-6"])
    assert len(calls) == 3 and len(list(cache.glob("*.json"))) == 1  # off: nothing read, nothing written


def test_a_changed_recipe_or_environment_composes_afresh(cache: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    calls = counting(monkeypatch)
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    mine = recipes / "mine.yaml"
    mine.write_text("# @package _global_\ntrainer:\n  max_steps: 7\n")
    assert load(["+recipe=mine"], (str(recipes),)).trainer.max_steps == 7
    mine.write_text("# @package _global_\ntrainer:\n  max_steps: 12\n")
    assert load(["+recipe=mine"], (str(recipes),)).trainer.max_steps == 12
    by_path = tmp_path / "elsewhere.yaml"
    by_path.write_text("# @package _global_\ntrainer:\n  max_steps: 3\n")
    assert load([f"+recipe={by_path}"]).trainer.max_steps == 3
    by_path.write_text("# @package _global_\ntrainer:\n  max_steps: 30\n")
    assert load([f"+recipe={by_path}"]).trainer.max_steps == 30
    assert load(["+recipe=swe_agent"]).agent.name == "claude_code"
    monkeypatch.setenv(c.AGENT_ENV, "codex")
    assert load(["+recipe=swe_agent"]).agent.name == "codex"
    assert len(calls) == 6


def test_errors_and_interpolations_are_never_cached(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = counting(monkeypatch)
    for _ in range(2):
        with pytest.raises(c.ConfigErrors):
            load(["+recipe=no_such_recipe"])
    monkeypatch.setenv("CANON_NAME", "from-env")
    assert load(["run.name=${oc.env:CANON_NAME}"]).run.name == "from-env"
    monkeypatch.setenv("CANON_NAME", "changed")
    assert load(["run.name=${oc.env:CANON_NAME}"]).run.name == "changed"
    assert len(calls) == 4 and not list(cache.glob("*.json"))


def test_a_cache_that_cannot_be_written_or_read_only_means_composing(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(cc.CACHE_ENV, str(blocker / "cache"))
    assert load(["trainer.max_steps=5"]).trainer.max_steps == 5
    where = tmp_path / "cache"
    monkeypatch.setenv(cc.CACHE_ENV, str(where))
    load(["trainer.max_steps=6"])
    (entry,) = where.glob("*.json")
    entry.write_text("{torn")
    assert load(["trainer.max_steps=6"]).trainer.max_steps == 6  # composed again, and written whole
    assert load(["trainer.max_steps=6"]).trainer.max_steps == 6


def test_config_show_from_the_cache_imports_no_hydra(cache: Path) -> None:
    import subprocess
    import sys

    probe = ("import sys, io, contextlib\n"
             "from slimecli.cli.app import app\n"
             "sys.argv = ['slimecli', 'config', 'show', '+recipe=swe_agent']\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    try:\n        app()\n    except SystemExit:\n        pass\n"
             "print(sorted(m for m in ('hydra', 'omegaconf', 'torch') if m in sys.modules))\n")
    runs = [subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
            for _ in range(2)]
    assert runs == ["['hydra', 'omegaconf']", "[]"]
