"""trainer.lora with trainer.weight_sync=disk: the adapter, not the model, goes to the engines.

SGLang's LoRA API (``--enable-lora``; ``/load_lora_adapter {"lora_name", "lora_path"}`` with a peft adapter
directory, ``/unload_lora_adapter {"lora_name"}``, and ``/update_weight_version {"new_version"}``): an adapter
serves only the requests that name it in ``lora_path``, so an SGLang engine's client names the adapter loaded
last. The embedded engine speaks the same API and merges the adapter into its weights, which every request then
gets (docs/lora.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import torch

from slimecli.config.schema import SlimeConfig
from slimecli.train.weight_sync.base import DeferredDelivery, Runner, _check, _gather, _ready


class AdapterDiskSync(DeferredDelivery):
    """trainer.lora over disk: RUN/weights/v<N>/ is a peft adapter directory (kilobytes to megabytes); each engine
    loads it as adapter ``policy-v<N>``, reports weight version N, then drops the adapter it served before."""

    def __init__(self, cfg: SlimeConfig, run_dir: Path, engines: list[Any], run: Runner) -> None:
        self.cfg, self.run_dir, self.engines, self.run = cfg, run_dir, engines, run
        self.loaded: dict[str, str] = {}  # engine url -> the adapter it serves
        self.last: tuple[str, str, int] | None = None  # (adapter name, directory, version) pushed last
        # the embedded engine serves the adapter it merged last to every request (a lora_path there must be empty)
        self.names_adapter = cfg.rollout.name == "sglang"

    def begin_push(self, state: dict[str, torch.Tensor], version: int,
                   engines_free: Callable[[], None] = _ready) -> tuple[str, Awaitable[None]]:
        from slimecli.train.hf_export import WEIGHTS_DIR, prune_versions
        from slimecli.train.lora import write_adapter

        exported = write_adapter(state, self.cfg, self.run_dir / WEIGHTS_DIR / f"v{version}")
        path, name = str(exported), f"policy-v{version}"
        engines_free()

        async def deliver() -> None:
            self.last = (name, path, version)
            await _gather(self._load(e, name, path, version) for e in self.engines)
            await asyncio.to_thread(prune_versions, exported, 2)

        return path, deliver()

    async def _load(self, engine: Any, name: str, path: str, version: int) -> None:
        """One engine loads adapter ``name`` from ``path`` and serves it as ``version``."""
        async def load() -> dict[str, Any]:
            result: dict[str, Any] = await engine.load_lora_adapter(name, path)
            if result.get("success"):
                previous, self.loaded[engine.base_url] = self.loaded.get(engine.base_url), name
                if self.names_adapter:  # SGLang serves an adapter only to requests that name it
                    engine.lora_name = name
                _check(engine, await engine.update_weight_version(version), f"version {version}")
                if previous is not None and previous != name:
                    _check(engine, await engine.unload_lora_adapter(previous), f"unload {previous}")
            return result

        _check(engine, await engine.sync_weights(load, str(version)), path)

    async def resync(self, engine: Any) -> bool:
        if self.last is None:
            return False
        self.loaded.pop(engine.base_url, None)  # a restarted engine serves no adapter
        await self._load(engine, *self.last)
        return True

    def before_update(self) -> None:
        pass

    def close(self) -> None:
        pass
