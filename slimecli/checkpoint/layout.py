"""Where a run's checkpoints live and what counts as one: RUN/checkpoints/step_<N>/ with its COMPLETE marker.

A checkpoint dir counts only with the marker (written last, before the rename into place), so a dir left
half-written by a kill is never resumed from. Torch-free.
"""

from __future__ import annotations

import re
from pathlib import Path

CHECKPOINTS = "checkpoints"
COMPLETE = "COMPLETE"
MANIFEST = "manifest.json"
MODEL_FILE = "model.safetensors"
META_FILE = "meta.json"
SHARDED = "sharded"  # a back-end's own sharded checkpoint inside a step dir (trainer=megatron)
REQUIRED = (MODEL_FILE, META_FILE)  # what even a checkpoint without a manifest must hold
_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def step_dirs(run_dir: str | Path) -> list[tuple[int, Path]]:
    """All step_<N> dirs, complete or not, by step."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return sorted(found)


def step_of(path: Path) -> int:
    """The training step a step_<N> checkpoint directory holds."""
    match = _STEP_DIR.match(path.name)
    if match is None:
        raise ValueError(f"{path} is not a step_<N> checkpoint directory")
    return int(match.group(1))


def is_step_dir(path: Path) -> bool:
    return bool(_STEP_DIR.match(path.name))


def is_complete(path: str | Path) -> bool:
    return (Path(path) / COMPLETE).is_file()


def sharded_dir(run_dir: str | Path, step: int) -> Path:
    """Where the ranks write a back-end's sharded checkpoint of ``step`` before rank 0 moves it into place."""
    return checkpoints_dir(run_dir) / f".sharded-step_{step}"
