"""``trainer.weight_sync=shared_memory``: the state dict copied into one tmpfs segment that co-located embedded
engines copy from (``/update_weights_from_shared_memory``); nothing is serialised, nothing reaches a disk. With
trainer.lora the segment carries the adapter's tensors, which the embedded engine merges into its kept base
weights."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import torch

from slimecli.train.weight_sync.base import Runner, _check, _gather, _ready

if TYPE_CHECKING:
    from slimecli.engine.weight_transfer import SlotJson

log = logging.getLogger("slimecli.train")


class SharedMemorySync:
    """One segment, reused while the state's layout stays the same (it does, step after step).

    A CPU engine serves from the segment itself after the first update. Where rank 0's model is on the CPU,
    unsharded and in the engines' dtype, its tensors move into the segment too: trainer and engines then
    share one copy of the weights and a push copies nothing. The engines are paused from before the
    optimizer step until the push, so no engine step reads weights the optimizer is writing. Otherwise each
    push writes the new weights into the segment while the engines are paused.
    """

    def __init__(self, engines: list[Any], run: Runner, dtype: str, policy: torch.nn.Module | None = None, *,
                 lora_config: dict[str, Any] | None = None) -> None:
        from slimecli.engine.shm import remove_stale_segments
        from slimecli.engine.weight_transfer import parse_dtype

        self.engines, self.run = engines, run
        self.lora_config = lora_config  # the tensors are a LoRA adapter the engines merge
        self.dtype = parse_dtype(dtype, "model.dtype")  # the engines' dtype: what they can serve from directly
        self.policy = policy if policy is not None and self._can_share(policy) else None
        self.shared = False  # the policy's tensors live in the segment
        self.paused = False
        self.segment: Any = None
        self.manifest: list[SlotJson] = []
        self.version: str | None = None  # the version the segment holds, once an update of every engine took it
        removed = remove_stale_segments()
        if removed:
            log.info("removed %d shared-memory weight segments left by trainers that are gone", removed)

    def _can_share(self, policy: torch.nn.Module) -> bool:
        from slimecli.train.policy import is_sharded

        tensors = list(policy.state_dict().values())
        return not is_sharded(policy) and all(
            t.device.type == "cpu" and (t.dtype == self.dtype or not t.is_floating_point()) for t in tensors)

    def before_update(self) -> None:
        if self.shared and not self.paused:
            self.run(_gather(e.pause() for e in self.engines))
            self.paused = True

    def begin_push(self, state: dict[str, torch.Tensor], version: int,
                   engines_free: Callable[[], None] = _ready) -> tuple[str, Awaitable[None] | None]:
        return self.push(state, version, engines_free), None  # the engines read the trainer's memory

    def push(self, state: dict[str, torch.Tensor], version: int, engines_free: Callable[[], None] = _ready) -> str:
        from slimecli.checkpoint.tensors import dedupe_views
        from slimecli.engine.shm import segment_dir
        from slimecli.engine.weight_transfer import SharedSegment, layout

        engines_free()

        tensors, _aliases = dedupe_views(state)  # a tied weight travels once; the engine's alias shares it
        # an adapter travels in its own dtype (float32): the engine merges it in float32
        slots, size = layout((k, self.dtype if t.is_floating_point() and self.lora_config is None else t.dtype,
                              list(t.shape))
                             for k, t in tensors.items())
        manifest = [s.to_json() for s in slots]
        if self.segment is None or manifest != self.manifest:
            self._release()
            name = f"slimecli-weights-{os.getpid()}-{uuid.uuid4().hex[:12]}"
            self.segment = SharedSegment(segment_dir() / name, size, create=True)
            self.manifest = manifest
            self.shared = False
        segment = self.segment

        def write() -> None:  # memory-bound: one thread copies as fast as several here
            with torch.no_grad():
                for slot in slots:
                    view, t = segment.view(slot), tensors[slot.name]
                    if view.data_ptr() != t.data_ptr():  # a shared tensor is already there
                        view.copy_(t)
            if self.policy is not None and not self.shared:
                self._share(segment, slots)

        async def update_all() -> None:
            if not self.paused:
                await _gather(e.pause() for e in self.engines)  # mode abort: nothing runs once it answers
            try:
                write()  # no engine runs a step now, so none reads the segment while it changes
                results = await _gather(e.update_weights_from_shared_memory(segment.path.name, manifest, str(version),
                                                                            lora_config=self.lora_config)
                                        for e in self.engines)
                for engine, result in zip(self.engines, results, strict=True):
                    _check(engine, result, segment.path.name)
                self.version = str(version)
            finally:
                self.paused = False
                await _gather((e.resume() for e in self.engines), return_exceptions=True)

        self.run(update_all())
        return str(segment.path.name)

    async def resync(self, engine: Any) -> bool:
        """The segment's weights to a restarted engine, paused meanwhile; left paused while the others are (the
        optimizer may be writing shared weights)."""
        if self.segment is None or self.version is None:
            return False
        await engine.pause()
        try:
            _check(engine, await engine.update_weights_from_shared_memory(
                self.segment.path.name, self.manifest, self.version, lora_config=self.lora_config),
                self.segment.path.name)
        finally:
            if not self.paused:
                await engine.resume()
        return True

    def _share(self, segment: Any, slots: list[Any]) -> None:
        """Rebind the policy's tensors to their place in the segment (which holds their values now)."""
        assert self.policy is not None
        targets = self.policy.state_dict(keep_vars=True)
        for slot in slots:
            target = targets.get(slot.name)
            if target is not None and list(target.shape) == slot.shape and target.dtype == slot.dtype:
                target.data = segment.view(slot)
        self.shared = True
        log.info("trainer and engines share one copy of the weights in %s", segment.path.name)

    def _release(self) -> None:
        if self.segment is not None:
            self.segment.close(unlink=True)  # tensors still viewing it keep the pages until they go
            self.segment = None

    def close(self) -> None:
        if self.paused:
            self.run(_gather((e.resume() for e in self.engines), return_exceptions=True))
            self.paused = False
        self._release()
