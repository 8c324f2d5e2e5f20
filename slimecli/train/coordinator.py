"""The rollout coordinator: the trainer's side of the engines (and teacher), and rank 0's records of the run.
It runs rollouts, evaluations and weight pushes on its own event loop; trainer rank 0 holds the one
RolloutCoordinator of a run, the other ranks a bare Coordinator that does none of it, so the training loop
calls the same methods on every rank and never asks which rank it is."""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import torch

from slimecli.config.layout import engine_slots
from slimecli.config.schema import SlimeConfig
from slimecli.rollout.collect import RolloutResult
from slimecli.rollout.data import PromptSource

if TYPE_CHECKING:
    from slimecli.checkpoint.store import Checkpoint
    from slimecli.train.backend import PolicyBackend
    from slimecli.train.records import StepRecords
    from slimecli.train.stages import StageTimer, StepBatch
    from slimecli.train.weight_sync.base import WeightSync

log = logging.getLogger("slimecli.train")

_T = TypeVar("_T")


class Collector(Protocol):
    """What rollout.generate makes: RolloutDriver, AgentRollout, or a factory's object."""

    async def collect(self) -> RolloutResult: ...


class Lifecycle(Protocol):
    """A collector with something to start once the engines are up and to stop at the end (AgentRollout)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class ProgressReporter(Protocol):
    """A collector that reports as it goes (AgentRollout): the step it collects for, where its status goes."""

    step: int
    on_progress: Callable[[str], None] | None


class Coordinator:
    """What the ranks other than 0 hold: they talk to no server and write no record, so each duty is a no-op
    here (a collect gives nothing: the batch comes by broadcast from rank 0)."""

    def resume_point(self) -> str | None:
        return None

    def restore(self, ckpt: Checkpoint) -> None:
        pass

    def wait_ready(self) -> None:
        pass

    def open_records(self, step: int, restored_row: dict[str, Any] | None) -> None:
        pass

    def begin_step(self, step: int) -> None:
        pass

    def collect(self) -> RolloutResult | None:
        return None

    def collect_next(self, step: int) -> None:
        pass

    def before_update(self) -> None:
        pass

    def push_weights(self, state: dict[str, torch.Tensor], version: int) -> str | None:
        return None

    def take_ahead_wait(self) -> float:
        return 0.0

    def evaluate(self, step: int) -> dict[str, float] | None:
        return None

    def step_row(self, step: int, batch: StepBatch, metrics: dict[str, float], evaluated: dict[str, Any],
                 timer: StageTimer, started: float) -> dict[str, Any] | None:
        return None

    def data_position(self) -> Any:
        return None

    def record(self, step: int, row: dict[str, Any] | None, timer: StageTimer, batch: StepBatch,
               evaluated: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def make_coordinator(cfg: SlimeConfig, run_dir: Path, tokenizer: Any, policy: PolicyBackend,
                     is_main: bool) -> Coordinator:
    """Rank 0's RolloutCoordinator (holding its model, for a weight sync that shares its memory); a bare
    Coordinator on every other rank."""
    if not is_main:
        return Coordinator()
    coordinator = RolloutCoordinator(cfg, run_dir, tokenizer)
    coordinator.policy = policy.shared_module()
    return coordinator


class RolloutCoordinator(Coordinator):
    """Rank 0's link to the servers: rollouts on the engines, teacher scores, new weights to the engines; and
    the run's records (metrics.jsonl, the progress line), which only rank 0 writes."""

    def __init__(self, cfg: SlimeConfig, run_dir: Path, tokenizer: Any):
        from slimecli.rollout.client import EngineClient

        self.cfg = cfg
        self.run_dir = run_dir
        # the servers are talked to from one event loop on its own thread, so a rollout can run on it while the
        # trainer's thread computes (trainer.async_rollout); run() waits for a coroutine there
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever, name="rollout-loop", daemon=True)
        self._loop_thread.start()
        self.ahead: Future[RolloutResult] | None = None  # the next step's rollout, generated ahead
        self.ahead_position: Any = None  # the prompt source's position before that rollout drew its prompts
        self.ahead_wait_s = 0.0
        # trainer.async_rollout with a disk push: the engines loading the weights last pushed, while the trainer
        # goes on; whatever talks to the engines next waits for it (settle(), or the rollout ahead awaits it)
        self.delivery: Future[None] | None = None
        r = cfg.rollout
        self.engines = [EngineClient(slot.url, timeout_s=r.request_timeout_s, api_key=r.api_key)
                        for slot in engine_slots(cfg)]  # every node's engines (config/layout.py)
        self.source = PromptSource(cfg.task, cfg.run.seed)
        self.driver = self._collector(tokenizer)
        self.evaluator = None  # eval.datasets on the engines, with the weights they serve now
        if cfg.eval.datasets:
            from slimecli.eval.runner import Evaluator

            self.evaluator = Evaluator(cfg, tokenizer, self.engines, run_dir)
        self.last_eval = ""  # the latest evaluation, for the progress line
        self.teacher = None
        self.weight_sync: WeightSync | None = None  # made at the first push, once the engines are up
        self.policy: torch.nn.Module | None = None  # rank 0's model, for a weight sync that shares its memory
        if cfg.teacher.name != "none":
            from slimecli.config.layout import teacher_urls
            from slimecli.teacher.client import TeacherPool

            # the teacher servers (one, or one per node) score the student's tokens at the rollout temperature
            self.teacher = TeacherPool(cfg.teacher, teacher_urls(cfg), temperature=cfg.rollout.temperature)
        self.records: StepRecords | None = None  # opened once the engines are up

    def _collector(self, tokenizer: Any) -> Collector:
        """What rollout.generate names (a registered kind, or an import path): a factory fn(cfg, tokenizer, engines,
        source) of an object whose async collect() returns a RolloutResult, and whose async start() and stop(),
        where it has them, run once the engines are up and at the end. A factory that takes `run_dir` gets the run
        directory (the agent kind keeps its run archive there)."""
        from slimecli.config.registry import GENERATE_KINDS

        factory = GENERATE_KINDS.get(self.cfg.rollout.generate).obj
        extra = {"run_dir": self.run_dir} if "run_dir" in inspect.signature(factory).parameters else {}
        collector: Collector = factory(self.cfg, tokenizer, self.engines, self.source, **extra)
        return collector

    # ---- resume ------------------------------------------------------------------------------------------------
    def resume_point(self) -> str | None:
        """The checkpoint the run resumes from, picked here so that every rank loads the same one (or none)."""
        from slimecli.checkpoint.store import latest_complete

        found = latest_complete(self.run_dir)
        return str(found) if found is not None else None

    def restore(self, ckpt: Checkpoint) -> None:
        """Rank 0's own state from the checkpoint: its RNGs and where the prompt source stood."""
        from slimecli.checkpoint.rng import restore_rng

        if ckpt.rng is not None:
            restore_rng(ckpt.rng)
        if ckpt.data_position is not None:
            self.source.load_state_dict(ckpt.data_position)
        log.info("resumed from %s at step %d", ckpt.path, ckpt.step)

    # ---- the run's records ---------------------------------------------------------------------------------------
    def open_records(self, step: int, restored_row: dict[str, Any] | None) -> None:
        """metrics.jsonl (with a row a kill cut off, kept by the checkpoint) and the progress line, from ``step``."""
        from slimecli.train.records import StepRecords

        self.records = StepRecords(self.run_dir, self.cfg.trainer.max_steps, step, self.cfg.reward.key, restored_row)

    def step_row(self, step: int, batch: StepBatch, metrics: dict[str, float], evaluated: dict[str, Any],
                 timer: StageTimer, started: float) -> dict[str, Any] | None:
        """The metrics row of step ``step`` (the checkpoint keeps it; record() logs it)."""
        assert self.records is not None  # open_records comes before the first step
        return self.records.row(step, batch, metrics, evaluated, timer, started)

    def record(self, step: int, row: dict[str, Any] | None, timer: StageTimer, batch: StepBatch,
               evaluated: dict[str, Any]) -> None:
        """The step's row to metrics.jsonl and its rewards (and an evaluation's headline) to the progress line."""
        assert self.records is not None and row is not None
        self.records.log(step, row, timer, batch, self.last_eval if evaluated else "")

    # ---- the engines ---------------------------------------------------------------------------------------------
    def run(self, coro: Awaitable[_T]) -> _T:
        return self.submit(coro).result()

    def submit(self, coro: Awaitable[_T]) -> Future[_T]:
        async def wrapped() -> _T:
            return await coro

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop)

    def wait_ready(self) -> None:
        async def all_ready() -> None:
            await asyncio.gather(*(e.wait_ready(self.cfg.rollout.start_timeout_s) for e in self.engines))
            if hasattr(self.driver, "start"):
                await cast(Lifecycle, self.driver).start()  # the agent kind's adapter

        self.run(all_ready())

    def watch(self, step: int, on_progress: Callable[[str], None]) -> None:
        """The step the next collect is for, and where a collector that reports as it goes sends its status."""
        if hasattr(self.driver, "on_progress"):
            reporter = cast(ProgressReporter, self.driver)
            reporter.step, reporter.on_progress = step, on_progress

    def begin_step(self, step: int) -> None:
        """Step ``step + 1`` is next: a collector that reports as it goes shows its status on the progress line."""
        assert self.records is not None
        self.watch(step + 1, self.records.progress.note)

    def collect(self) -> RolloutResult:
        """This step's rollout: the one generated ahead if there is one, else one generated now."""
        if self.ahead is not None:
            ahead, self.ahead, self.ahead_position = self.ahead, None, None
            return ahead.result()
        self.settle()
        return self.run(self._collect())

    def collect_next(self, step: int) -> None:
        """trainer.async_rollout, unless step ``step + 1`` is the last: the next step's rollout starts now, on the
        weights the engines hold, while this one trains."""
        if not self.cfg.trainer.async_rollout or step + 1 >= self.cfg.trainer.max_steps:
            return
        assert self.records is not None
        self.watch(step + 2, self.records.progress.note)
        self.collect_ahead()

    def collect_ahead(self) -> None:
        """Start the next step's rollout on the engines' current weights and return at once (async_rollout);
        it begins once the engines hold the weights last pushed."""
        if self.ahead is not None:
            raise RuntimeError("a rollout is already being generated ahead")
        self.ahead_position = self.source.state_dict()
        delivery, self.delivery = self.delivery, None

        async def after_delivery() -> RolloutResult:
            if delivery is not None:
                await asyncio.wrap_future(delivery)  # its error, if any, is this rollout's
            return await self._collect()

        self.ahead = self.submit(after_delivery())

    def settle(self) -> None:
        """Wait until the engines hold the weights last pushed; an error of theirs is raised here."""
        delivery, self.delivery = self.delivery, None
        if delivery is not None:
            delivery.result()

    def wait_ahead(self) -> None:
        """Block until the rollout generated ahead is in (before new weights may reach the engines)."""
        if self.ahead is not None:
            started = time.perf_counter()
            self.ahead.exception()  # waits; an error is raised where the batch is taken
            self.ahead_wait_s += time.perf_counter() - started

    def take_ahead_wait(self) -> float:
        """Seconds spent waiting for the rollout ahead since the last call (rollout time the training step did
        not hide)."""
        waited, self.ahead_wait_s = self.ahead_wait_s, 0.0
        return waited

    def data_position(self) -> Any:
        """Where the prompt source stands for a checkpoint: before a rollout drawn ahead but not trained on."""
        return self.ahead_position if self.ahead is not None else self.source.state_dict()

    async def _collect(self) -> RolloutResult:
        result = await self.driver.collect()
        if self.teacher is not None:
            result.metrics.update(await self._teacher_scores(result))
        return result

    async def _teacher_scores(self, result: RolloutResult) -> dict[str, float]:
        assert self.teacher is not None  # collect() asks only when there is one
        scores = await self.teacher.score(result.samples)
        gaps, teacher_means = [], []
        for sample, teacher_lp in zip(result.samples, scores, strict=True):
            sample.teacher_log_probs = list(teacher_lp)
            mask = sample.effective_loss_mask()
            student = sample.rollout_log_probs or [0.0] * sample.response_length
            n = sum(mask)
            if n:
                teacher_means.append(sum(t * m for t, m in zip(teacher_lp, mask, strict=True)) / n)
                gaps.append(sum((s - t) * m for s, t, m in zip(student, teacher_lp, mask, strict=True)) / n)
        return {"opd/teacher_logp_mean": _mean(teacher_means), "opd/student_teacher_gap": _mean(gaps)}

    def evaluate(self, step: int) -> dict[str, float] | None:
        """The eval metrics after training step ``step`` (0: before the first) when an evaluation is due then."""
        if self.evaluator is None or not self.evaluator.due(step, self.cfg.trainer.max_steps):
            return None
        from slimecli.eval.runner import flat_metrics, headline

        self.settle()  # the weights of ``step``
        results = self.run(self.evaluator.evaluate(step))
        self.last_eval = headline(results)
        log.info("step %d: %s", step, self.last_eval)
        return {**flat_metrics(results), "eval/weight_version": step}

    def push_weights(self, state: dict[str, torch.Tensor], version: int) -> str:
        """Every engine gets these weights as ``version`` the way trainer.weight_sync says."""
        if self.weight_sync is None:
            from slimecli.train.weight_sync import make_weight_sync

            self.weight_sync = make_weight_sync(self.cfg, self.run_dir, self.engines, self.run, self.policy)
        self.settle()
        # the rollout ahead is in before any engine is touched: one weight version per sequence
        path, delivery = self.weight_sync.begin_push(state, version, engines_free=self.wait_ahead)
        if delivery is not None and self.cfg.trainer.async_rollout:
            self.delivery = self.submit(delivery)  # the next rollout ahead starts once it is done
        elif delivery is not None:
            self.run(delivery)
        return path

    def before_update(self) -> None:
        """The optimizer is about to change the weights (an engine sharing them must not run meanwhile)."""
        if self.weight_sync is not None:
            self.weight_sync.before_update()

    def close(self) -> None:
        if self.records is not None:
            self.records.close()
        if self.ahead is not None:  # the run ended (or failed) with a rollout still in flight
            self.ahead.cancel()
            self.ahead = None
        if self.delivery is not None:  # the last push: the engines finish loading it (they may serve on)
            try:
                self.settle()
            except Exception as exc:  # noqa: BLE001  # closing: the run's own outcome is already decided
                log.warning("the engines did not take the last weights: %s", exc)
        if self.weight_sync is not None:
            self.weight_sync.close()
        if hasattr(self.driver, "stop"):
            self.run(cast(Lifecycle, self.driver).stop())
        for engine in self.engines:
            close = getattr(engine, "close", None)
            if close is not None:
                self.run(close())
        if self.teacher is not None:
            self.run(self.teacher.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(timeout=10)
        if not self._loop_thread.is_alive():
            self.loop.close()


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
