"""Rank 0's rollouts: one per training step, generated ahead of the trainer within trainer.max_staleness.

The rollout of step j (the one that trains the weights of version j) is admitted once it can land within the
bound: with trainer.staleness_strategy=wait, once the engines hold the weights of version j - max_staleness, so
that none of its tokens is sampled by older weights, and just in time: while the rollouts already in would run
out, at the trainer's pace, before one begun now is in (so a run that generation outpaces stays close to
on-policy, and one whose long tails hold generation back uses the whole bound); with ``drop``, once the trainer has taken the rollout of step j - max_staleness - 1 (the engines
never wait, and what ends up too old is left out of the loss by the staleness stage). Synchronous training (trainer.async_rollout=false) collects each step's rollout
when the trainer asks for it.

A weight push without partial rollouts holds admission and waits for the rollouts in flight (so that no sequence
mixes two weight versions); with partial rollouts the engines pause the requests in flight instead, and they go
on under the new weights.

The prompt ledger: each rollout's draws are tagged with its step (rollout/data.py DRAWER), and leave the ledger
when the trainer takes it; a checkpoint keeps the rest, which a resumed run re-issues first.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from slimecli.config.schema import SlimeConfig
from slimecli.rollout.collect import RolloutResult
from slimecli.rollout.data import DRAWER, PromptSource

if TYPE_CHECKING:
    from slimecli.train.coordinator.server_loop import ServerLoop
    from slimecli.train.coordinator.teacher import TeacherScoring


class Collector(Protocol):
    """What rollout.generate makes: RolloutDriver, EnvRollout, AgentRollout, or a factory's object."""

    async def collect(self) -> RolloutResult: ...


class Rollouts:
    """What the ranks other than 0 hold: they collect nothing (the batch comes by broadcast from rank 0)."""

    def start(self, step: int) -> None:
        pass

    def take(self, step: int) -> RolloutResult | None:
        return None

    def take_wait(self) -> float:
        return 0.0

    def ledger(self) -> Any:
        return None

    def restore(self, state: Any) -> None:
        pass

    def close(self) -> None:
        pass


class RolloutPipeline(Rollouts):
    def __init__(self, cfg: SlimeConfig, loop: ServerLoop, collector: Collector, source: PromptSource,
                 teacher: TeacherScoring | None = None) -> None:
        t = cfg.trainer
        self.ahead = t.async_rollout
        self.max_staleness, self.strategy, self.max_steps = t.max_staleness, t.staleness_strategy, t.max_steps
        self.loop, self.collector, self.source, self.teacher = loop, collector, source, teacher
        self.version = 0  # the weights the engines hold, as the step that made them (0: the initial ones)
        self.taken = 0  # rollouts the trainer has taken: the step it trains next
        self.next = 0  # the step whose rollout is admitted next
        self.holds = 0  # pushes waiting for the rollouts in flight: none is admitted meanwhile
        self.in_flight: dict[int, asyncio.Task[RolloutResult]] = {}
        self.wait_s = 0.0  # trainer time spent waiting for rollouts at a push (rollout time it did not hide)
        self.pace = Pace()
        self._changed: asyncio.Event | None = None
        self._feeder: Future[None] | None = None

    # ---- the trainer's thread ------------------------------------------------------------------------------
    def start(self, step: int) -> None:
        """The run trains step ``step`` next; with async_rollout, rollouts are admitted from now on."""
        self.taken = self.next = step
        if self.ahead:
            self._feeder = self.loop.submit(self._feed())

    def take(self, step: int) -> RolloutResult:
        """The rollout of step ``step`` (generated ahead, or now)."""
        return self.loop.run(self._take(step))

    def take_wait(self) -> float:
        waited, self.wait_s = self.wait_s, 0.0
        return waited

    def ledger(self) -> Any:
        """Where the prompt stream stands, for a checkpoint: the next fresh position and what is in flight."""
        async def state() -> dict[str, Any]:
            return self.source.state_dict()

        return self.loop.run(state())

    def restore(self, state: Any) -> None:
        self.source.load_state_dict(state)

    def close(self) -> None:
        async def cancel() -> None:
            for task in self.in_flight.values():
                task.cancel()
            self.in_flight.clear()

        if self._feeder is not None:
            self._feeder.cancel()
        self.loop.run(cancel())

    # ---- the loop's thread ---------------------------------------------------------------------------------
    async def hold(self) -> None:
        """No rollout is admitted until release(), and the ones in flight are in (a push that must not mix
        weight versions in one sequence)."""
        started = time.perf_counter()
        self.holds += 1
        running = [task for task in self.in_flight.values() if not task.done()]
        if running:
            await asyncio.wait(running)
        self.wait_s += time.perf_counter() - started

    async def release(self) -> None:
        self.holds -= 1
        self._poke()

    async def on_version(self, version: int) -> None:
        """The engines hold the weights of ``version``."""
        self.version = version
        self._poke()

    def admissible(self, step: int) -> bool:
        """Whether the rollout of ``step`` may start now. With ``wait``, within the bound, and just in time: only
        while the rollouts already in and waiting, taken one a training step, would run out before a rollout
        begun now could be in. When the trainer sets the pace, a rollout begun earlier would only be older when
        it trains (the bound is a limit, not a target); when generation does (long tails), the engines keep
        working ahead, up to the bound."""
        if self.holds:
            return False
        if self.strategy == "drop":
            return step <= self.taken + self.max_staleness
        if step > self.version + self.max_staleness:
            return False
        ready = 0  # rollouts in, in the order the trainer takes them, from the next one
        while (task := self.in_flight.get(self.taken + ready)) is not None and task.done():
            ready += 1
        return ready == 0 or self.pace.step_s is None or ready * self.pace.step_s < (self.pace.rollout_s or 0.0)

    async def _feed(self) -> None:
        while self.next < self.max_steps:
            await self._until(lambda: self.admissible(self.next))
            self._admit(self.next)

    def _admit(self, step: int) -> None:
        context = contextvars.copy_context()
        context.run(DRAWER.set, step)  # the prompts it draws are its own in the ledger
        task = asyncio.get_running_loop().create_task(self._rollout(step), context=context)
        task.add_done_callback(lambda _: self._poke())
        self.in_flight[step] = task
        self.next = step + 1
        self._poke()

    async def _rollout(self, step: int) -> RolloutResult:
        if hasattr(self.collector, "step"):
            self.collector.step = step + 1  # a collector that reports as it goes (the agent kind): the step
        admitted, started = self.version, time.perf_counter()
        result = await self.collector.collect()
        self.pace.rollout_done(time.perf_counter() - started)
        if self.teacher is not None:
            result.metrics.update(await self.teacher.score(result))
        result.metrics["rollout/admitted_version"] = admitted
        return result

    async def _take(self, step: int) -> RolloutResult:
        if not self.ahead and step not in self.in_flight:
            self._admit(step)
        await self._until(lambda: step in self.in_flight)
        task = self.in_flight[step]
        try:
            return await task
        finally:
            del self.in_flight[step]
            self.pace.taken()
            self.taken = step + 1
            self.source.settle(step)
            self._poke()

    def _poke(self) -> None:
        if self._changed is not None:
            changed, self._changed = self._changed, None
            changed.set()

    async def _until(self, ready: Callable[[], bool]) -> None:
        while not ready():
            if self._changed is None:
                self._changed = asyncio.Event()
            await self._changed.wait()


class Pace:
    """How long a rollout takes to generate, and how often the trainer takes one: moving averages."""

    SMOOTHING = 0.3

    def __init__(self) -> None:
        self.rollout_s: float | None = None
        self.step_s: float | None = None
        self._last_take: float | None = None

    def rollout_done(self, seconds: float) -> None:
        self.rollout_s = _average(self.rollout_s, seconds, self.SMOOTHING)

    def taken(self) -> None:
        now = time.perf_counter()
        if self._last_take is not None:
            self.step_s = _average(self.step_s, now - self._last_take, self.SMOOTHING)
        self._last_take = now


def _average(old: float | None, new: float, weight: float) -> float:
    return new if old is None else (1 - weight) * old + weight * new


class ReplayRollouts(Rollouts):
    """rollout.replay: each step's rollout read from a dump (rollout/dump.py) instead of generated."""

    def __init__(self, path: str) -> None:
        from slimecli.rollout.dump import dump_dir

        self.root = dump_dir(path)

    def take(self, step: int) -> RolloutResult:
        from slimecli.rollout.dump import read_step

        dumped = read_step(self.root, step + 1)  # step + 1: the metrics row of the step that trains it
        return RolloutResult(dumped.samples, dumped.train_rewards, {**dumped.metrics, "rollout/replayed": 1.0})
