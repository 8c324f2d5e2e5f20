"""Atomic training checkpoints: RUN/checkpoints/step_<N>/, written in a temp dir then renamed into place.
The trainer's rank 0 saves and every rank loads; the names are in layout.py.

A checkpoint dir counts only with its COMPLETE marker (written last, before the rename), so a dir left
half-written by a kill is never resumed from. Layout of one checkpoint:
  model.safetensors   model state (tensors sharing storage, e.g. tied embeddings, stored once)
  optimizer.pt        optimizer state (absent when the optimizer keeps none)
  scheduler.pt        lr-scheduler state (optional)
  rng.pt              python, numpy, torch (and CUDA) RNG states
  meta.json           step, data position, free metadata
  manifest.json       every file above with its size and SHA-256 (checkpoint/manifest.py)
  COMPLETE

On resume a checkpoint counts only when its files match its manifest; a damaged one is skipped with a
warning naming it and the previous one is used (CheckpointDamaged when none is left).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from slimecli.checkpoint import manifest
from slimecli.checkpoint.layout import (
    COMPLETE,
    META_FILE,
    MODEL_FILE,
    SHARDED,
    checkpoints_dir,
    is_complete,
    is_step_dir,
    step_dirs,
    step_of,
)
from slimecli.checkpoint.manifest import CheckpointDamaged
from slimecli.checkpoint.rng import rng_state
from slimecli.checkpoint.tensors import split_shared

__all__ = ["Checkpoint", "CheckpointDamaged", "latest_complete", "load", "prune", "save", "step_dirs"]
log = logging.getLogger(__name__)
_ALIASES_KEY = "slimecli_aliases"


@dataclass
class Checkpoint:
    path: Path
    step: int
    model_state: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any] | None = None
    scheduler_state: dict[str, Any] | None = None
    rng: dict[str, Any] | None = None
    data_position: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    sharded: Path | None = None  # a back-end's own sharded checkpoint (trainer=megatron: megatron-core's format)
    critic_state: dict[str, Any] | None = None  # trainer.critic's weights and optimizer state (critic.pt)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: Path, data: bytes | str) -> None:
    with open(path, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())


def _torch_save(obj: Any, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _remove(path: Path) -> None:
    """Drop the marker first: a dir half-deleted by a kill must not look complete."""
    (path / COMPLETE).unlink(missing_ok=True)
    shutil.rmtree(path, ignore_errors=True)


def latest_complete(run_dir: str | Path) -> Path | None:
    """The newest checkpoint with its COMPLETE marker whose files match its manifest; half-written dirs are
    ignored, damaged ones skipped with a warning (CheckpointDamaged when there are some but none is usable)."""
    return manifest.newest_usable(run_dir)


def save(run_dir: str | Path, step: int, model_state: dict[str, torch.Tensor], *,
         optimizer_state: dict[str, Any] | None = None, scheduler_state: dict[str, Any] | None = None,
         data_position: Any = None, metadata: dict[str, Any] | None = None, keep: int = 2,
         rng: dict[str, Any] | None = None, sharded: Path | None = None,
         critic_state: dict[str, Any] | None = None) -> Path:
    """Write RUN/checkpoints/step_<step>/ atomically and keep only the newest ``keep`` (<= 0: keep all).

    ``data_position`` and ``metadata`` must be JSON-serialisable. ``rng`` defaults to the current states.
    Call from one process (rank 0) after gathering the full model state. ``sharded``: a directory the ranks
    wrote together (sharded_dir(run_dir, step)), moved in as SHARDED before the manifest is written.
    """
    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    for stale in [*root.glob(".tmp-step_*"), *root.glob(".sharded-step_*")]:  # left by a killed writer
        if sharded is None or stale.resolve() != sharded.resolve():
            shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step_{step}"
    tmp = root / f".tmp-step_{step}-{os.getpid()}"
    tmp.mkdir()
    try:
        tensors, aliases = split_shared(model_state)
        save_file(tensors, str(tmp / MODEL_FILE), metadata={"format": "pt", _ALIASES_KEY: json.dumps(aliases)})
        if optimizer_state is not None:
            _torch_save(optimizer_state, tmp / "optimizer.pt")
        if scheduler_state is not None:
            _torch_save(scheduler_state, tmp / "scheduler.pt")
        _torch_save(rng if rng is not None else rng_state(), tmp / "rng.pt")
        if critic_state is not None:
            _torch_save(critic_state, tmp / "critic.pt")
        if sharded is not None:
            os.rename(sharded, tmp / SHARDED)
        meta = {"step": step, "data_position": data_position, "metadata": metadata or {}}
        _write(tmp / META_FILE, json.dumps(meta, indent=2))
        manifest.write(tmp)
        _write(tmp / COMPLETE, f"{step}\n")
        _fsync_dir(tmp)
        if final.exists():  # the same step saved again (a resumed run): replace it
            _remove(final)
        os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune(run_dir, keep)
    return final


def prune(run_dir: str | Path, keep: int) -> None:
    """Keep the newest ``keep`` complete checkpoints; drop older ones and incomplete dirs older than those.

    A checkpoint whose files do not have their recorded sizes does not count as one of the kept ones.
    """
    if keep <= 0:
        return
    dirs = step_dirs(run_dir)
    complete = [(s, p) for s, p in dirs if manifest.sizes_match(p)]
    if not complete:
        return
    kept = complete[-keep:]
    oldest_kept = kept[0][0]
    for s, p in dirs:
        if (s, p) not in kept and ((s, p) in complete or s < oldest_kept):
            _remove(p)


def load(path: str | Path, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Read a checkpoint dir (or, given a run dir, its newest usable checkpoint).

    When a file of it cannot be loaded (damage its manifest could not show, or a checkpoint without one),
    it is skipped with a warning and the previous usable checkpoint is loaded instead; CheckpointDamaged
    (naming the file) when none is left.
    """
    path = Path(path)
    if not is_step_dir(path):
        found = latest_complete(path)
        if found is None:
            raise FileNotFoundError(f"no complete checkpoint under {checkpoints_dir(path)}")
        path = found
    if not is_complete(path):
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {COMPLETE} marker)")
    damaged: list[tuple[Path, str]] = []
    while True:
        try:
            return _load_one(path, map_location)
        except _Unloadable as exc:
            log.warning("checkpoint %s is damaged (%s); skipped", path, exc)
            damaged.append((path, str(exc)))
        try:
            previous = manifest.newest_usable(path.parent.parent, below=step_of(path))
        except CheckpointDamaged as exc:
            raise CheckpointDamaged(damaged + exc.damaged) from None
        if previous is None:
            raise CheckpointDamaged(damaged)
        log.warning("resuming from the previous complete checkpoint %s", previous)
        path = previous


class _Unloadable(Exception):
    """A file of a checkpoint that looked whole cannot be read."""


def _load_one(path: Path, map_location: str | torch.device) -> Checkpoint:
    from safetensors import SafetensorError, safe_open

    device = str(map_location)
    model_file = path / MODEL_FILE
    try:
        model_state = load_file(str(model_file), device=device)
        with safe_open(str(model_file), framework="pt") as f:
            aliases = json.loads((f.metadata() or {}).get(_ALIASES_KEY, "{}"))
        for alias, name in aliases.items():
            model_state[alias] = model_state[name]
    except (SafetensorError, OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise _Unloadable(f"{MODEL_FILE}: {exc}") from None

    def optional(name: str) -> Any:
        p = path / name
        try:
            return torch.load(p, map_location=map_location, weights_only=True) if p.is_file() else None
        except Exception as exc:  # noqa: BLE001 - unpickling garbage raises anything; the file is what is named
            raise _Unloadable(f"{name}: {type(exc).__name__}: {exc}") from None

    try:
        meta = json.loads((path / META_FILE).read_text())
        step = int(meta["step"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _Unloadable(f"{META_FILE}: {exc}") from None
    return Checkpoint(path=path, step=step, model_state=model_state,
                      optimizer_state=optional("optimizer.pt"), scheduler_state=optional("scheduler.pt"),
                      rng=optional("rng.pt"), critic_state=optional("critic.pt"),
                      data_position=meta.get("data_position"),
                      metadata=meta.get("metadata") or {},
                      sharded=path / SHARDED if (path / SHARDED).is_dir() else None)
