"""``trainer.weight_sync=disk``: an HF checkpoint directory under RUN/weights, then ``/update_weights_from_disk``
(any engine). The engines load from the files, so their part may run while the trainer goes on."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import torch

from slimecli.config.schema import SlimeConfig
from slimecli.train.weight_sync.base import DeferredDelivery, Runner, _check, _gather, _ready


class DiskSync(DeferredDelivery):
    def __init__(self, cfg: SlimeConfig, run_dir: Path, engines: list[Any], run: Runner) -> None:
        self.cfg, self.run_dir, self.engines, self.run = cfg, run_dir, engines, run
        self.last: tuple[str, str] | None = None  # (directory, version) of the newest weights on disk

    def begin_push(self, state: dict[str, torch.Tensor], version: int,
                   engines_free: Callable[[], None] = _ready) -> tuple[str, Awaitable[None]]:
        """The trainer's part (the checkpoint on disk), then the engines' part as a coroutine: the engines load
        from the files, so that part may run on rank 0's event loop while the trainer goes on."""
        from slimecli.train.hf_export import export_version, prune_versions

        exported = export_version(state, self.cfg.model.resolved_path, self.run_dir, version, keep=None)
        path = str(exported)
        engines_free()

        async def one(engine: Any) -> None:
            _check(engine, await engine.sync_weights(path, str(version)), path)

        async def deliver() -> None:
            self.last = (path, str(version))  # complete on disk: a restarted engine loads these
            await _gather(one(e) for e in self.engines)
            await asyncio.to_thread(prune_versions, exported, 2)  # the engines hold this one: two are kept

        return path, deliver()

    def before_update(self) -> None:
        pass

    async def resync(self, engine: Any) -> bool:
        if self.last is None:
            return False
        path, version = self.last
        _check(engine, await engine.sync_weights(path, version), path)
        return True

    def close(self) -> None:
        pass
