"""Rank 0's evaluations during training (eval.datasets), pinned to a weight version and run beside training.

The evaluation of step k begins once the engines hold the weights of step k and runs on the server loop while
the trainer goes on; the next weight push waits for it before it touches an engine, so every token it scores
comes from those weights. Its metrics go in step k's own row (eval/weight_version = k; the evaluation at start
has a row of its own, step 0), which the records hold until the evaluation is in.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from slimecli.config.schema import SlimeConfig

if TYPE_CHECKING:
    from slimecli.eval.runner import DatasetResult, Evaluator
    from slimecli.train.coordinator.server_loop import ServerLoop

log = logging.getLogger("slimecli.train")


class Evaluation:
    """What the ranks other than 0 hold (and rank 0 without eval.datasets): nothing to evaluate."""

    headline = ""  # the latest evaluation, for the progress line

    def begin(self, step: int, after: Future[None] | None = None) -> None:
        pass

    def landed(self, wait: bool = False) -> list[tuple[int, dict[str, Any]]]:
        return []

    def in_flight(self) -> set[int]:
        return set()

    async def quiesce(self) -> None:
        pass

    def close(self) -> None:
        pass


class PinnedEvaluation(Evaluation):
    def __init__(self, cfg: SlimeConfig, evaluator: Evaluator, loop: ServerLoop) -> None:
        self.cfg, self.evaluator, self.loop = cfg, evaluator, loop
        self.running: list[tuple[int, Future[list[DatasetResult]]]] = []

    def begin(self, step: int, after: Future[None] | None = None) -> None:
        """The evaluation of the weights of ``step`` when one is due, once ``after`` (their push) has landed."""
        if not self.evaluator.due(step, self.cfg.trainer.max_steps):
            return

        async def evaluate() -> list[DatasetResult]:
            if after is not None:
                await asyncio.wrap_future(after)
            return await self.evaluator.evaluate(step)

        self.running.append((step, self.loop.submit(evaluate())))

    def landed(self, wait: bool = False) -> list[tuple[int, dict[str, Any]]]:
        """(step, metrics) of each evaluation finished since the last call (of all of them with ``wait``), oldest
        first."""
        from slimecli.eval.runner import flat_metrics, headline

        out: list[tuple[int, dict[str, Any]]] = []
        for step, future in list(self.running):
            if not (wait or future.done()):
                continue
            self.running.remove((step, future))
            results = future.result()
            self.headline = headline(results)
            log.info("eval of step %d: %s", step, self.headline)
            out.append((step, {**flat_metrics(results), "eval/weight_version": step}))
        return out

    def in_flight(self) -> set[int]:
        """The steps whose evaluation has not been taken by landed() yet."""
        return {step for step, _ in self.running}

    async def quiesce(self) -> None:
        """Wait for the evaluations in flight (a weight push is about to change what they score)."""
        pending = [asyncio.wrap_future(future) for _, future in self.running if not future.done()]
        if pending:
            await asyncio.wait(pending)

    def close(self) -> None:
        """The run ended (or failed) with evaluations in flight: they are dropped before the engines close."""
        for _, future in self.running:
            future.cancel()
        self.running.clear()
