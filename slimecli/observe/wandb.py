"""Optional Weights & Biases logging (observe.wandb=true; `pip install 'slimecli[wandb]'`).

The metrics writer (observe/metrics.py, rank 0) hands every row to this sink with the names of metrics.jsonl
(nested values flattened to "a/b", as for TensorBoard). The W&B run is named observe.wandb_run_name or the
run directory's name, keeps its files in RUN/wandb/, and a resumed run continues the same W&B run (its id is
kept in RUN/wandb/run_id). WANDB_MODE=offline works as W&B documents it. W&B never stops training: a missing
package or a failing call is a warning, and logging carries on without it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slimecli.config.groups.observe import ObserveConfig

log = logging.getLogger(__name__)

WANDB_DIR = "wandb"
RUN_ID_FILE = "run_id"


def observe_config(run_dir: Path) -> ObserveConfig | None:
    """The observe section of RUN/config.yaml (None when the run has no config file or it cannot be read)."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    try:
        from slimecli.config.io import load_frozen

        return load_frozen(path).observe
    except Exception as exc:  # noqa: BLE001 - a config that does not load here: no W&B, metrics still flow
        log.warning("observe settings not read from %s: %s", path, exc)
        return None


def _plain_config(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "config.yaml"
    try:
        import yaml

        data = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except Exception as exc:  # noqa: BLE001 - the config is a courtesy for the W&B page: say why it is missing
        log.warning("the run config is not attached to the W&B run: %s: %s", type(exc).__name__, exc)
        return {}
    return data if isinstance(data, dict) else {}


def _run_id(run_dir: Path) -> str:
    path = run_dir / WANDB_DIR / RUN_ID_FILE
    if path.is_file():
        text = path.read_text(encoding="utf-8").strip()
        if text:
            return text
    run_id = uuid.uuid4().hex[:8]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(run_id + "\n", encoding="utf-8")
    return run_id


class WandbSink:
    def __init__(self, run: Any) -> None:
        self.run = run

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log(dict(scalars), step=int(step))

    def close(self) -> None:
        self.run.finish()


def open_wandb(run_dir: Path, observe: ObserveConfig | None) -> WandbSink | None:
    """A W&B run for ``run_dir`` when observe.wandb is on and wandb is installed, else None."""
    if observe is None or not observe.wandb:
        return None
    try:
        import wandb
    except ImportError:
        log.warning("observe.wandb=true but wandb is not installed (pip install 'slimecli[wandb]'); "
                    "logging to metrics.jsonl and TensorBoard only")
        return None
    try:
        (run_dir / WANDB_DIR).mkdir(parents=True, exist_ok=True)
        run = wandb.init(project=observe.wandb_project, name=observe.wandb_run_name or run_dir.name,
                         id=_run_id(run_dir), resume="allow", dir=str(run_dir),
                         config=_plain_config(run_dir))
    except Exception as exc:  # noqa: BLE001 - no key, no network, ...: say so, train on
        log.warning("W&B logging disabled: wandb.init failed: %s", exc)
        return None
    return WandbSink(run)
