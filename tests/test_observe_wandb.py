"""observe.wandb=true: the metrics writer also logs to Weights & Biases under metrics.jsonl's names (offline mode
here), a resumed run continues the same W&B run, and a missing wandb package is a warning, not a failure."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import yaml

from slimecli.config.groups.observe import ObserveConfig
from slimecli.observe.metrics import MetricsLogger, read_metrics
from tests.helpers import wait_until

try:
    import wandb  # noqa: F401
except ImportError:
    wandb_installed = False
else:
    wandb_installed = True

needs_wandb = pytest.mark.skipif(not wandb_installed, reason="wandb is not installed (pip install 'slimecli[wandb]')")


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))


def wandb_files(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))


def recorded(run_dir: Path, *names: bytes, runs: int = 1) -> list[Path]:
    """The run's offline W&B files once ``runs`` of them exist and the last holds every name (W&B's service
    process may still be writing when finish() returns)."""
    def ready() -> list[Path] | None:
        files = wandb_files(run_dir)
        return files if len(files) == runs and all(n in files[-1].read_bytes() for n in names) else None

    return wait_until(ready, timeout=60, what=f"{names} in {run_dir}/wandb/offline-run-*/run-*.wandb")


@needs_wandb
def test_metrics_go_to_wandb_under_the_same_names(offline: None, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    observe = ObserveConfig(wandb=True, wandb_project="slimecli-test", wandb_run_name="my-run")
    with MetricsLogger(run_dir, tensorboard=False, observe=observe) as m:
        assert m.wandb_enabled
        m.log(1, {"reward/mean": 0.25, "train/grad_norm": 1.5, "eval": {"heldout": {"reward_mean": 0.5}},
                  "note": "text goes to the JSON line only"})
        m.log(2, {"reward/mean": 0.75, "train/grad_norm": 0.5})
    assert [r["reward/mean"] for r in read_metrics(run_dir)] == [0.25, 0.75]
    (record,) = recorded(run_dir, b"reward/mean", b"train/grad_norm", b"eval/heldout/reward_mean", b"my-run",
                         b"slimecli-test")
    run_id = (run_dir / "wandb" / "run_id").read_text().strip()
    assert run_id in record.name
    with MetricsLogger(run_dir, tensorboard=False, observe=observe, resume_step=2) as m:  # a resume
        m.log(3, {"reward/mean": 1.0})
    assert all(run_id in p.name for p in recorded(run_dir, b"reward/mean", runs=2))


@needs_wandb
def test_the_observe_settings_come_from_the_runs_config(offline: None, tmp_path: Path) -> None:
    """The trainer builds its MetricsLogger with the run directory only: RUN/config.yaml says whether to log to W&B."""
    from slimecli.config.io import save_frozen
    from slimecli.config.schema import SlimeConfig

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save_frozen(SlimeConfig(), run_dir / "config.yaml")
    with MetricsLogger(run_dir, tensorboard=False) as m:
        assert not m.wandb_enabled  # observe.wandb defaults to false
    data = yaml.safe_load((run_dir / "config.yaml").read_text())
    data["observe"]["wandb"] = True
    (run_dir / "config.yaml").write_text(yaml.safe_dump(data))
    with MetricsLogger(run_dir, tensorboard=False) as m:
        assert m.wandb_enabled
        m.log(1, {"reward/mean": 0.5})
    recorded(run_dir, b"reward/mean")


def test_without_wandb_installed_it_is_a_warning(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with caplog.at_level(logging.WARNING), MetricsLogger(tmp_path, tensorboard=False,
                                                         observe=ObserveConfig(wandb=True)) as m:
        assert not m.wandb_enabled
        m.log(1, {"reward/mean": 0.5})
    assert "pip install 'slimecli[wandb]'" in caplog.text
    assert read_metrics(tmp_path)[0]["reward/mean"] == 0.5
