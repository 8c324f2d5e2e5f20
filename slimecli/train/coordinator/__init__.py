"""The coordinator: the trainer's side of the servers, in typed parts, and rank 0's records of the run.

- rollouts (rollouts.py): each step's rollout, generated ahead within trainer.max_staleness, and the ledger of
  the prompts in flight;
- weights (weights.py): the trained weights to the engines;
- evaluation (evaluation.py): eval.datasets on a pinned weight version, beside training;
- teacher scoring (teacher.py): each sample's teacher's log-probs of it (on-policy distillation);
- the records: metrics.jsonl and the progress line (train/records.py).

Trainer rank 0 holds a RolloutCoordinator, whose parts talk to the servers from one event loop on a thread of
its own (server_loop.py). Every other rank holds a Coordinator, whose parts are no-ops, so the training loop
calls the same methods on every rank and never asks which rank it is.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from slimecli.config.layout import engine_slots
from slimecli.config.schema import SlimeConfig
from slimecli.config.teachers import run_teachers
from slimecli.rollout.data import PromptSource
from slimecli.train.coordinator.evaluation import Evaluation, PinnedEvaluation
from slimecli.train.coordinator.recovery import EngineRecovery, wants_recovery
from slimecli.train.coordinator.rollouts import Collector, ReplayRollouts, RolloutPipeline, Rollouts
from slimecli.train.coordinator.server_loop import ServerLoop
from slimecli.train.coordinator.weights import EngineWeights, WeightPush

if TYPE_CHECKING:
    from slimecli.checkpoint.store import Checkpoint
    from slimecli.train.backend import PolicyBackend
    from slimecli.train.records import StepRecords
    from slimecli.train.stages import StageTimer, StepBatch

__all__ = ["Coordinator", "Evaluation", "RolloutCoordinator", "Rollouts", "WeightPush", "make_coordinator"]

log = logging.getLogger("slimecli.train")


class Lifecycle(Protocol):
    """A collector with something to start once the engines are up and to stop at the end (AgentRollout)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class Coordinator:
    """What the ranks other than 0 hold: no server to talk to, no record to write."""

    def __init__(self) -> None:
        self.rollouts: Rollouts = Rollouts()
        self.weights: WeightPush = WeightPush()
        self.evaluation: Evaluation = Evaluation()

    def resume_point(self) -> str | None:
        return None

    def restore(self, ckpt: Checkpoint) -> None:
        pass

    def wait_ready(self) -> None:
        pass

    def open_records(self, step: int, restored_row: dict[str, Any] | None) -> None:
        pass

    def evaluate_start(self, step: int) -> None:
        pass

    def step_row(self, step: int, batch: StepBatch, metrics: dict[str, float], evaluated: dict[str, Any],
                 timer: StageTimer, started: float) -> dict[str, Any] | None:
        return None

    def record(self, step: int, row: dict[str, Any] | None, timer: StageTimer, batch: StepBatch,
               evaluations: list[tuple[int, dict[str, Any]]]) -> None:
        pass

    def data_position(self) -> Any:
        return self.rollouts.ledger()

    def dump(self, step: int, batch: StepBatch) -> None:
        pass

    def close(self) -> None:
        pass


def make_coordinator(cfg: SlimeConfig, run_dir: Path, tokenizer: Any, policy: PolicyBackend,
                     is_main: bool) -> Coordinator:
    """Rank 0's RolloutCoordinator (holding its model, for a weight sync that shares its memory); a bare
    Coordinator on every other rank."""
    if not is_main:
        return Coordinator()
    return RolloutCoordinator(cfg, run_dir, tokenizer, policy.shared_module())


class RolloutCoordinator(Coordinator):
    """Rank 0's parts, on the servers' event loop, and the run's records (metrics.jsonl, the progress line)."""

    def __init__(self, cfg: SlimeConfig, run_dir: Path, tokenizer: Any, policy: Any = None):
        from slimecli.rollout.client import EngineClient

        super().__init__()
        self.cfg, self.run_dir, self.tokenizer = cfg, run_dir, tokenizer
        self.loop = ServerLoop()
        self.records: StepRecords | None = None  # opened once the engines are up
        self.teacher = None
        self.collector: Collector | None = None
        self.engines: list[Any] = []
        r, t = cfg.rollout, cfg.trainer
        if r.replay:  # the dumped samples, no server: nothing to push to, evaluate on, or score with
            self.rollouts = ReplayRollouts(r.replay)
            return
        pause_mode = t.pause_mode if t.partial_rollouts else "abort"
        self.engines = [EngineClient(slot.url, timeout_s=r.request_timeout_s, api_key=r.api_key, pause_mode=pause_mode)
                        for slot in engine_slots(cfg)]  # every node's engines (config/layout.py)
        self.source = PromptSource(cfg.task, cfg.run.seed)
        self.collector = collector = self._collector(tokenizer)
        if run_teachers(cfg):
            from slimecli.train.coordinator.teacher import TeacherScoring

            self.teacher = TeacherScoring(cfg)
        self.rollouts = pipeline = RolloutPipeline(cfg, self.loop, collector, self.source, self.teacher)
        if cfg.eval.datasets:
            from slimecli.eval.runner import Evaluator

            self.evaluation = PinnedEvaluation(cfg, Evaluator(cfg, tokenizer, self.engines, run_dir), self.loop)
        self.weights = weights = EngineWeights(cfg, run_dir, self.engines, self.loop, pipeline, self.evaluation,
                                               policy)
        if wants_recovery(cfg):  # an engine the supervisor restarts gets the weights before it generates again
            recovery = EngineRecovery(cfg, weights)
            # this node's engines, which its own supervisor restarts; an engine of another node is lost with its
            # node as often as not, and the run stops then as before (docs/reliability.md)
            for engine, slot in zip(self.engines, engine_slots(cfg), strict=True):
                if slot.node == cfg.cluster.node_rank:
                    engine.recovery = recovery
            if hasattr(collector, "follow_restarts"):  # the agent kind's adapter has clients of its own
                cast(Any, collector).follow_restarts([engine.recovery for engine in self.engines])

    def dump(self, step: int, batch: StepBatch) -> None:
        """rollout.dump: step ``step``'s samples to RUN/rollouts, before it trains on them."""
        if self.cfg.rollout.dump:
            from slimecli.rollout.dump import write_step

            write_step(self.run_dir, step, batch.samples, batch.rewards, batch.metrics)

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
        """Rank 0's own state from the checkpoint: its RNGs and the prompt ledger."""
        from slimecli.checkpoint.rng import restore_rng

        if ckpt.rng is not None:
            restore_rng(ckpt.rng)
        if ckpt.data_position is not None:
            self.rollouts.restore(ckpt.data_position)
        log.info("resumed from %s at step %d", ckpt.path, ckpt.step)

    def wait_ready(self) -> None:
        async def all_ready() -> None:
            import asyncio

            await asyncio.gather(*(e.wait_ready(self.cfg.rollout.start_timeout_s) for e in self.engines))
            if self.teacher is not None:
                await self.teacher.check(self.tokenizer)  # a teacher of another vocabulary refuses the run
            if hasattr(self.collector, "start"):
                await cast(Lifecycle, self.collector).start()  # the agent kind's adapter

        self.loop.run(all_ready())

    # ---- the run's records ---------------------------------------------------------------------------------------
    def open_records(self, step: int, restored_row: dict[str, Any] | None) -> None:
        """metrics.jsonl (with a row a kill cut off, kept by the checkpoint) and the progress line, from ``step``;
        a collector that reports as it goes (the agent kind) shows its status on the progress line."""
        from slimecli.train.records import StepRecords

        self.records = StepRecords(self.run_dir, self.cfg.trainer.max_steps, step, self.cfg.reward.key, restored_row,
                                   self.cfg.observe)
        if self.collector is not None and hasattr(self.collector, "on_progress"):
            cast(Any, self.collector).on_progress = self.records.progress.note

    def evaluate_start(self, step: int) -> None:
        """The evaluation of the weights the run starts from, where one is due (eval.at_start) and its row is not
        written yet (a resume: the checkpoint's row a kill cut off before its evaluation was in)."""
        assert self.records is not None
        if self.records.awaits_evaluation(step):
            self.evaluation.begin(step, self.weights.delivery)
        self.records.write_rows([], self.evaluation.in_flight())

    def step_row(self, step: int, batch: StepBatch, metrics: dict[str, float], evaluated: dict[str, Any],
                 timer: StageTimer, started: float) -> dict[str, Any] | None:
        """The metrics row of step ``step`` (the checkpoint keeps it; record() logs it)."""
        assert self.records is not None  # open_records comes before the first step
        return self.records.row(step, batch, metrics, evaluated, timer, started)

    def record(self, step: int, row: dict[str, Any] | None, timer: StageTimer, batch: StepBatch,
               evaluations: list[tuple[int, dict[str, Any]]]) -> None:
        """The step's rewards (and the headline of an evaluation just in) to the progress line, and its row, with
        ``evaluations`` joined to their steps' rows, to metrics.jsonl once its own evaluation is in."""
        assert self.records is not None and row is not None
        self.records.log(step, row, timer, batch, self.evaluation.headline if evaluations else "")
        self.records.write_rows(evaluations, self.evaluation.in_flight())

    def close(self) -> None:
        if self.records is not None:
            self.records.close()
        self.rollouts.close()  # a rollout still in flight is dropped
        self.evaluation.close()
        self.weights.close()
        if hasattr(self.collector, "stop"):
            self.loop.run(cast(Lifecycle, self.collector).stop())
        for engine in self.engines:
            self.loop.run(engine.close())
        if self.teacher is not None:
            self.loop.run(self.teacher.close())
        self.loop.close()
