"""A run `slimecli train` named itself (runs/quickstart-<time>) resumes by its directory, relative or absolute,
with no run.resume=force; every run prints the command that resumes it, and a finished one says so and how to
go on instead of starting its servers."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from slimecli.config.compose import load
from slimecli.config.errors import ConfigErrors
from slimecli.launch import controller
from slimecli.launch.rundir import RunDir, prepare, resume_command


def opened(overrides: list[str]) -> RunDir:
    """prepare() as `slimecli train OVERRIDES` does it, its lock released (one process opens the run twice)."""
    run = prepare(load(overrides), ["slimecli", "train", *overrides], overrides)
    assert run.lock is not None
    run.lock.release()
    return run


@pytest.fixture
def auto_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    run = opened([])  # run.dir unset: runs/quickstart-<time>
    assert not run.resumed and run.path.parent == tmp_path / "runs" and run.path.name.startswith("quickstart-")
    assert "dir: null" in run.config_path.read_text()  # what made the resume refuse before
    return run.path


@pytest.mark.parametrize("spelling", ["relative", "absolute", "dot-relative"])
def test_an_auto_named_run_resumes_by_its_directory(auto_named: Path, spelling: str) -> None:
    given = {"relative": f"runs/{auto_named.name}", "absolute": str(auto_named),
             "dot-relative": f"./runs/../runs/{auto_named.name}"}[spelling]
    run = opened([f"run.dir={given}"])
    assert run.resumed and run.path == auto_named
    assert run.changed == []  # run.dir is not a change: the stored config was found in this directory


def test_force_lists_what_changed_but_not_run_dir(auto_named: Path) -> None:
    with pytest.raises(ConfigErrors) as refused:
        opened([f"run.dir=runs/{auto_named.name}", "optimizer.lr=0.5"])
    message = refused.value.render()
    assert "holds a run with other settings (optimizer.lr: 0.005 -> 0.5); resuming" in message
    assert "pass run.resume=force to resume it changing optimizer.lr: 0.005 -> 0.5" in message
    run = opened([f"run.dir=runs/{auto_named.name}", "optimizer.lr=0.5", "run.resume=force"])
    assert run.resumed and run.changed == ["optimizer.lr: 0.005 -> 0.5 (run.resume=force)"]


def test_a_run_directory_that_was_moved_still_resumes(auto_named: Path) -> None:
    moved = auto_named.with_name("elsewhere")
    auto_named.rename(moved)
    run = opened([f"run.dir={moved}"])
    assert run.resumed and run.changed == []


def test_the_resume_command_names_the_run_absolutely_and_keeps_only_the_node(tmp_path: Path) -> None:
    """The run's settings are in its stored config (config/resume.py): only which node this is is repeated."""
    command = resume_command(tmp_path / "runs" / "x", ["optimizer=stateless_adam", "run.dir=old", "run.resume=force",
                                                       "run.name=it's", "cluster.node_rank=1"])
    assert command == f"slimecli train cluster.node_rank=1 run.dir={tmp_path}/runs/x"
    then = resume_command(tmp_path, ["trainer.max_steps=2", "optimizer.lr=0.1"], ["trainer.max_steps=4"])
    assert then == f"slimecli train trainer.max_steps=4 run.dir={tmp_path}"


def save_checkpoint(run_dir: Path, step: int) -> None:
    import torch

    from slimecli.checkpoint import store

    store.save(run_dir, step, {"w": torch.zeros(2, 2)}, optimizer_state=None, scheduler_state={},
               data_position={"offset": step})


def launch(monkeypatch: pytest.MonkeyPatch, overrides: list[str]) -> tuple[int, str]:
    """controller.run as `slimecli train` calls it, its machine checks skipped, its console captured."""
    monkeypatch.setattr(controller, "materialize", lambda cfg: cfg)
    monkeypatch.setattr(controller, "check", lambda cfg: None)
    started: list[object] = []
    monkeypatch.setattr(controller, "Supervisor", lambda *a, **k: started.append(a) or pytest.fail("launched"))
    console = Console(record=True, width=400, force_terminal=False)
    code = controller.run(load(overrides), ["slimecli", "train", *overrides], overrides, console=console)
    return code, console.export_text()


def test_a_finished_run_says_so_and_how_to_go_on_without_starting_anything(auto_named: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    save_checkpoint(auto_named, 2)
    code, out = launch(monkeypatch, [f"run.dir=runs/{auto_named.name}", "trainer.max_steps=2"])
    assert code == 0
    assert f"resume: slimecli train run.dir={auto_named}" in out
    assert "run complete: 2/2 steps done; raise trainer.max_steps to continue it" in out
    assert f"continue it, e.g. slimecli train trainer.max_steps=4 run.dir={auto_named}\n" in out
    assert not (auto_named / ".lock").exists()  # released: the next command may open the run at once


def test_a_run_with_steps_left_goes_on_to_launch(auto_named: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_checkpoint(auto_named, 1)
    with pytest.raises(pytest.fail.Exception, match="launched"):
        launch(monkeypatch, [f"run.dir={auto_named}", "trainer.max_steps=2"])
