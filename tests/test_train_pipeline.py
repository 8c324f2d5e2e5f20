"""The rollout pipeline (train/coordinator/rollouts.py): rollouts ahead of the trainer within
trainer.max_staleness, the hold of a push without partial rollouts, the prompt ledger, and the weight part."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path

import pytest

from slimecli.config.compose import load
from slimecli.config.groups.task import TaskConfig
from slimecli.rollout.collect import RolloutResult
from slimecli.rollout.data import PromptSource
from slimecli.rollout.sample import Sample
from slimecli.train.coordinator.evaluation import Evaluation
from slimecli.train.coordinator.rollouts import RolloutPipeline
from slimecli.train.coordinator.server_loop import ServerLoop
from slimecli.train.coordinator.weights import EngineWeights
from tests.helpers import wait_until


class TimedCollector:
    """Each rollout draws 4 prompts and takes a random time: 1 in 4 is ten times longer (a long tail). It notes
    the engines' version when it began, and how many rollouts ran at once."""

    def __init__(self, source: PromptSource, seed: int = 0) -> None:
        self.source, self.rng = source, random.Random(seed)
        self.versions: list[int] = []  # per rollout, in start order
        self.running = self.most_running = 0
        self.pipeline: RolloutPipeline | None = None

    async def collect(self) -> RolloutResult:
        assert self.pipeline is not None
        began = self.pipeline.version
        self.versions.append(began)
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        positions = [r["position"] for r in self.source.next(4)]
        await asyncio.sleep(0.002 * (10 if self.rng.random() < 0.25 else 1))
        self.running -= 1
        sample = Sample(index=positions[0], weight_versions=[str(began)], metadata={"positions": positions})
        return RolloutResult([sample], [0.0], {})


def pipeline(tmp_path: Path, *overrides: str) -> tuple[RolloutPipeline, TimedCollector, ServerLoop]:
    cfg = load(["trainer.async_rollout=true", "trainer.max_steps=30", *overrides])
    source = PromptSource(TaskConfig(), 0)
    collector = TimedCollector(source)
    loop = ServerLoop()
    p = RolloutPipeline(cfg, loop, collector, source)
    collector.pipeline = p
    return p, collector, loop


@pytest.mark.parametrize("n", [1, 2, 4])
def test_every_rollout_trains_within_the_bound_and_the_prompt_stream_is_whole(tmp_path: Path, n: int):
    p, collector, loop = pipeline(tmp_path, f"trainer.max_staleness={n}", "trainer.partial_rollouts=true")
    try:
        p.start(0)
        seen: list[int] = []
        for step in range(30):
            result = p.take(step)
            began = int(result.samples[0].weight_versions[0])
            assert step - began <= n, f"step {step} trained a rollout begun on version {began}"
            assert result.metrics["rollout/admitted_version"] == began
            seen += result.samples[0].metadata["positions"]
            time.sleep(0.003 * random.Random(step).random())  # the training step
            loop.run(p.on_version(step + 1))  # the push of the weights it made
        assert sorted(seen) == list(range(120))  # no prompt twice, none skipped
        assert collector.most_running <= n + 1  # never more ahead than the bound allows
        if n > 1:  # the long tail holds generation back: it goes further ahead than one step
            assert collector.most_running >= 2
        assert len(collector.versions) == 30 and max(step - v for step, v in enumerate(collector.versions)) <= n
    finally:
        p.close()
        loop.close()


def test_drop_admits_without_waiting_for_the_push(tmp_path: Path):
    p, _, loop = pipeline(tmp_path, "trainer.max_staleness=1", "trainer.staleness_strategy=drop",
                          "trainer.partial_rollouts=true")
    try:
        p.start(0)
        p.take(0)
        # the trainer took step 0's rollout and has pushed nothing: wait would admit up to step 1, drop step 2
        wait_until(lambda: 2 in p.in_flight, 5, "drop to admit step 2 before any push")
        assert p.version == 0 and p.admissible(3) is False
    finally:
        p.close()
        loop.close()


def test_a_push_without_partial_rollouts_holds_admission_until_the_rollouts_in_flight_are_in(tmp_path: Path):
    p, collector, loop = pipeline(tmp_path, "trainer.max_staleness=1")
    gate = threading.Event()
    inner = collector.collect

    async def gated() -> RolloutResult:
        while not gate.is_set():
            await asyncio.sleep(0.005)
        return await inner()

    collector.collect = gated  # type: ignore[method-assign]
    try:
        p.start(0)
        wait_until(lambda: 1 in p.in_flight, 5, "step 1's rollout to be admitted")
        holder = threading.Thread(target=lambda: loop.run(p.hold()))
        holder.start()
        holder.join(0.3)
        assert holder.is_alive()  # the push waits for steps 0 and 1 in flight
        gate.set()
        holder.join(5)
        assert not holder.is_alive() and p.take_wait() > 0.2
        loop.run(p.on_version(1))
        time.sleep(0.1)
        assert 2 not in p.in_flight  # held: nothing new starts until the engines hold the new weights
        loop.run(p.release())
        wait_until(lambda: 2 in p.in_flight, 5, "step 2 admitted after the release")
    finally:
        gate.set()
        p.close()
        loop.close()


def test_the_ledger_keeps_what_is_in_flight_and_a_resume_reissues_it_first(tmp_path: Path):
    p, collector, loop = pipeline(tmp_path, "trainer.max_staleness=2", "trainer.partial_rollouts=true")
    try:
        p.start(0)
        first = p.take(0).samples[0].metadata["positions"]
        wait_until(lambda: all(s in p.in_flight and p.in_flight[s].done() for s in (1, 2)), 5, "steps 1, 2 ahead")
        ledger = p.ledger()
        assert first == [0, 1, 2, 3] and ledger["position"] == 12
        assert sorted(ledger["reissue"]) == list(range(4, 12))  # drawn by steps 1 and 2, not trained
    finally:
        p.close()
        loop.close()
    resumed, collector, loop = pipeline(tmp_path, "trainer.max_staleness=2", "trainer.partial_rollouts=true")
    try:
        resumed.restore(ledger)
        resumed.start(1)
        seen = first[:]
        for step in range(1, 6):
            seen += resumed.take(step).samples[0].metadata["positions"]
            loop.run(resumed.on_version(step + 1))
        assert sorted(seen) == list(range(24))
        assert resumed.source.state_dict()["position"] >= 24
    finally:
        resumed.close()
        loop.close()


class GatedEngine:
    """An engine whose weight load finishes only when the test opens its gate (or fails, when told to)."""

    base_url = "http://engine.test"

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.loaded: list[str] = []
        self.refuse = False

    async def sync_weights(self, path: str, version: str) -> dict:
        while not self.gate.is_set():
            await asyncio.sleep(0.01)
        if self.refuse:
            return {"success": False, "message": "no room"}
        assert Path(path, "model.safetensors").is_file()  # the export is on disk before the engine is asked
        self.loaded.append(version)
        return {"success": True}


@pytest.mark.parametrize("overlapped", [True, False])
def test_a_disk_push_lets_the_trainer_go_on_while_the_engines_load(tmp_path: Path, overlapped: bool):
    from safetensors.torch import load_file

    from tests.helpers.teacher import make_checkpoint

    ckpt = make_checkpoint(tmp_path / "model", seed=0)
    state = load_file(str(ckpt / "model.safetensors"))
    cfg = load([f"model.path={ckpt}", f"trainer.async_rollout={str(overlapped).lower()}"])
    p, _, loop = pipeline(tmp_path)
    engine = GatedEngine()
    weights = EngineWeights(cfg, tmp_path / "run", [engine], loop, p, Evaluation(), None)
    try:
        pusher = threading.Thread(target=weights.push, args=(state, 1))
        pusher.start()
        pusher.join(0.5)
        if not overlapped:  # a synchronous step's push returns once the engines hold the weights
            assert pusher.is_alive() and engine.loaded == []
            engine.gate.set()
            pusher.join(10)
            assert engine.loaded == ["1"] and weights.delivery is None and p.version == 1
            return
        assert not pusher.is_alive() and engine.loaded == [] and p.version == 0  # the engine is still loading
        assert (tmp_path / "run" / "weights" / "v1" / "model.safetensors").is_file()
        engine.gate.set()
        weights.settle()
        assert engine.loaded == ["1"] and p.version == 1 and p.holds == 0  # admission goes on at version 1

        engine.gate.clear()
        engine.refuse = True
        weights.push(state, 2)
        engine.gate.set()
        with pytest.raises(RuntimeError, match="refused weights .*no room"):
            weights.settle()  # what the next push does first
        assert p.version == 1 and p.holds == 0  # the engines still serve version 1, and admission is not stuck
    finally:
        engine.gate.set()
        p.close()
        loop.close()


def test_admission_is_just_in_time_within_the_bound(tmp_path: Path):
    """With ``wait`` a rollout starts only while those already in, taken one a training step, would run out before
    it could be in: the trainer's pace, not the bound, decides how far ahead generation goes."""
    p, _, loop = pipeline(tmp_path, "trainer.max_staleness=4", "trainer.partial_rollouts=true")
    try:
        done, running = asyncio.Future(loop=loop.loop), asyncio.Future(loop=loop.loop)
        loop.loop.call_soon_threadsafe(done.set_result, None)
        time.sleep(0.05)
        p.version, p.taken = 10, 11
        p.in_flight = {11: done, 12: done, 13: running}  # two in, one being generated
        p.pace.step_s, p.pace.rollout_s = 0.1, 0.5  # generation takes five training steps
        assert p.admissible(14)  # 2 ready x 0.1 s run out before a rollout begun now is in (0.5 s)
        assert not p.admissible(15)  # the bound: version 10 + 4
        p.pace.step_s, p.pace.rollout_s = 0.4, 0.5  # a slow trainer: 2 x 0.4 s outlast a new rollout
        assert not p.admissible(14)
        p.in_flight = {11: running, 12: done}  # the next one is still out: generation sets the pace
        assert p.admissible(14)
        p.holds = 1
        assert not p.admissible(14)  # a push without partial rollouts holds admission
    finally:
        loop.loop.call_soon_threadsafe(running.cancel)
        p.in_flight = {}
        p.close()
        loop.close()
