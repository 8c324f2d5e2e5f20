"""Rank 0's weight pushes: the trained weights to every engine, the way trainer.weight_sync says.

Before a push touches an engine, the evaluation in flight finishes (it is pinned to the version it began on),
and without partial rollouts the rollouts in flight come in and none is admitted until the engines hold the new
weights. With trainer.partial_rollouts the engines pause the requests in flight instead (trainer.pause_mode:
in_place keeps their KV cache, retract recomputes it), load the weights, and go on. A disk push's engine part
runs on the server loop while the trainer goes on (async_rollout); whatever talks to the engines next waits
for it.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from slimecli.config.schema import SlimeConfig

if TYPE_CHECKING:
    from slimecli.train.coordinator.evaluation import Evaluation
    from slimecli.train.coordinator.rollouts import RolloutPipeline
    from slimecli.train.coordinator.server_loop import ServerLoop
    from slimecli.train.weight_sync.base import WeightSync

log = logging.getLogger("slimecli.train")
INITIAL_VERSION = "default"  # the weight_version an engine (SGLang's, slimecli's) reports before any update


class WeightPush:
    """What the ranks other than 0 hold: they push nothing."""

    delivery: Future[None] | None = None

    def push(self, state: dict[str, torch.Tensor], version: int) -> str | None:
        return None

    def before_update(self) -> None:
        pass

    def settle(self) -> None:
        pass

    def close(self) -> None:
        pass


class EngineWeights(WeightPush):
    def __init__(self, cfg: SlimeConfig, run_dir: Path, engines: list[Any], loop: ServerLoop,
                 rollouts: RolloutPipeline, evaluation: Evaluation, policy: torch.nn.Module | None) -> None:
        self.cfg, self.run_dir, self.engines, self.loop = cfg, run_dir, engines, loop
        self.rollouts, self.evaluation, self.policy = rollouts, evaluation, policy
        self.partial = cfg.trainer.partial_rollouts
        self.sync: WeightSync | None = None  # made at the first push, once the engines are up
        self.delivery = None  # the engines' part of the last push, running on the server loop
        self._held = False

    def push(self, state: dict[str, torch.Tensor], version: int) -> str:
        """Every engine gets these weights as ``version``; with async_rollout a disk push's engine part goes on
        on the server loop (the next push, an evaluation or the admission of a rollout waits for it)."""
        if self.sync is None:
            from slimecli.train.weight_sync import make_weight_sync

            self.sync = make_weight_sync(self.cfg, self.run_dir, self.engines, self.loop.run, self.policy)
        self.settle()
        try:
            path, delivery = self.sync.begin_push(state, version, engines_free=self._engines_free)
        except BaseException:
            self._release()
            raise

        async def deliver() -> None:
            try:
                if delivery is not None:
                    await delivery
            finally:
                if self._held:
                    self._held = False
                    await self.rollouts.release()
            await self.rollouts.on_version(version)

        if self.cfg.trainer.async_rollout:
            self.delivery = self.loop.submit(deliver())
        else:
            self.loop.run(deliver())
        return path

    def _engines_free(self) -> None:
        """Called by the weight sync before it touches an engine: the pinned evaluation finishes, and without
        partial rollouts the rollouts in flight come in."""
        self.loop.run(self.evaluation.quiesce())
        if not self.partial:
            self._held = True
            self.loop.run(self.rollouts.hold())

    def _release(self) -> None:
        if self._held:
            self._held = False
            self.loop.run(self.rollouts.release())

    async def resync(self, engine: Any) -> str:
        """A restarted engine gets the weights last pushed (on the server loop); before any push, its own are the
        run's, and it is let generate under the engines' first label. Returns the version it serves."""
        if self.sync is not None and await self.sync.resync(engine):
            return str(self.rollouts.version)
        await engine.update_weight_version(INITIAL_VERSION)
        return INITIAL_VERSION

    def settle(self) -> None:
        """Wait until the engines hold the weights last pushed; an error of theirs is raised here."""
        delivery, self.delivery = self.delivery, None
        if delivery is not None:
            delivery.result()

    def before_update(self) -> None:
        """The optimizer is about to change the weights (an engine sharing them must not run meanwhile)."""
        if self.sync is not None:
            self.sync.before_update()

    def close(self) -> None:
        if self.delivery is not None:  # the last push: the engines finish loading it (they may serve on)
            try:
                self.settle()
            except Exception as exc:  # noqa: BLE001  # closing: the run's own outcome is already decided
                log.warning("the engines did not take the last weights: %s", exc)
        if self.sync is not None:
            self.sync.close()
