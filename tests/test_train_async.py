"""trainer.async_rollout: the next step's rollout generated while the trainer trains, one weight version behind."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
import torch

from slimecli.config.compose import load
from slimecli.config.errors import ConfigErrors
from slimecli.launch.free_ports import with_free_ports
from slimecli.rollout.driver import RolloutResult
from slimecli.rollout.sample import Sample
from slimecli.train import stages
from slimecli.train.coordinator import RolloutCoordinator
from slimecli.train.stages import StepBatch
from tests.helpers import wait_until
from tests.helpers.train_e2e import metrics, run_train


def batch_of(*versions: list[str]) -> StepBatch:
    samples = [Sample(index=i, tokens=[1, 2, 3], response_length=1, weight_versions=v) for i, v in enumerate(versions)]
    return StepBatch(samples, [0.0] * len(samples), {})


def test_staleness_counts_versions_behind_and_drops_what_is_too_old():
    batch = batch_of(["3"], ["2"], ["default"], ["2", "3"], ["1"], [""])
    out = stages.staleness(batch, version=3, max_staleness=1)
    # gaps 0, 1, 3 ("default" = the weights before any update), 1 (oldest part counts), 2; "" is unknown
    assert out == {"rollout/staleness_max": 3.0, "rollout/staleness_mean": pytest.approx(7 / 5),
                   "rollout/stale_dropped": 2.0}
    assert [s.remove_sample for s in batch.samples] == [False, False, True, False, True, False]
    assert batch.samples[2].effective_loss_mask() == [0]  # in the batch, but no loss
    assert stages.staleness(batch_of(["1"]), version=3, max_staleness=2)["rollout/stale_dropped"] == 0.0


def test_config_rules():
    with pytest.raises(ConfigErrors) as exc:
        load(["trainer.async_rollout=true", "trainer.weight_sync=shared_memory", "trainer.max_staleness=0"])
    text = str(exc.value)
    assert "trainer.async_rollout" in text and "weight_sync=disk" in text
    assert "trainer.max_staleness" in text
    with pytest.raises(ConfigErrors) as exc:
        load(["trainer.async_rolout=true"])
    assert "did you mean 'trainer.async_rollout'" in str(exc.value)
    assert load(["trainer.async_rollout=true"]).trainer.async_rollout is True


class GatedCollector:
    """A rollout that finishes only when the test opens its gate; it records the prompt position it saw."""

    def __init__(self, source) -> None:
        self.source = source
        self.gate = threading.Event()
        self.started = threading.Event()

    async def collect(self) -> RolloutResult:
        self.started.set()
        self.source.position += 8  # the prompts this rollout draws
        while not self.gate.is_set():
            await asyncio.sleep(0.01)
        return RolloutResult([Sample(index=0)], [1.0], {"reward/mean": 1.0})


class RecordingSync:
    def __init__(self) -> None:
        self.prepared: list[int] = []
        self.pushed: list[int] = []

    def push(self, state: dict[str, torch.Tensor], version: int, engines_free=lambda: None) -> str:
        self.prepared.append(version)  # the trainer's own part (DiskSync: the HF export) does not wait
        engines_free()
        self.pushed.append(version)
        return "disk"

    def begin_push(self, state: dict[str, torch.Tensor], version: int, engines_free=lambda: None):
        return self.push(state, version, engines_free), None

    def before_update(self) -> None: ...

    def close(self) -> None: ...


def test_overlapped_processes_share_the_cores(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    import os

    from slimecli.launch.plan import build_plan

    for key in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(16)))  # a 16-core node

    def envs(*overrides: str) -> dict[str, dict[str, str]]:
        cfg = load(["trainer.nproc=1", "rollout.num_engines=1", *overrides])
        omp = ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")
        return {spec.name: {k: v for k, v in spec.env.items() if k in omp} for spec in build_plan(with_free_ports(cfg), tmp_path)}

    assert envs("trainer.async_rollout=false") == {"engine-0": {}, "trainer": {}}
    sleep = {"OMP_WAIT_POLICY": "PASSIVE"}  # idle threads sleep instead of spinning on the other side's cores
    assert envs("trainer.async_rollout=true") == {"engine-0": {**sleep, "OMP_NUM_THREADS": "8"},
                                                  "trainer": {**sleep, "OMP_NUM_THREADS": "8"}}
    three = envs("trainer.async_rollout=true", "rollout.num_engines=3")
    assert {three[name]["OMP_NUM_THREADS"] for name in ("engine-0", "engine-2", "trainer")} == {"4"}
    ranks = envs("trainer.async_rollout=true", "trainer.nproc=2", "rollout.num_engines=2")
    assert ranks["trainer"]["OMP_NUM_THREADS"] == ranks["engine-1"]["OMP_NUM_THREADS"] == "4"
    sglang = envs("trainer.async_rollout=true", "rollout=sglang")  # SGLang's threads are its own business
    assert sglang == {"engine-0": sleep, "trainer": {**sleep, "OMP_NUM_THREADS": "16"}}
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # what the user set wins
    assert envs("trainer.async_rollout=true") == {"engine-0": sleep, "trainer": sleep}


def test_rollout_ahead_runs_while_the_caller_works_and_blocks_the_weight_push(tmp_path: Path):
    coordinator = RolloutCoordinator(with_free_ports(load(["trainer.async_rollout=true"])), tmp_path, tokenizer=None)
    try:
        collector = GatedCollector(coordinator.source)
        coordinator.driver = collector
        sync = RecordingSync()
        coordinator.weight_sync = sync  # type: ignore[assignment]
        coordinator.collect_ahead()  # returns at once; the rollout runs on the coordinator's loop thread
        wait_until(collector.started.is_set, 10, "the rollout ahead to start")
        assert coordinator.data_position() == {"position": 0}  # a checkpoint now must not skip its prompts
        with pytest.raises(RuntimeError, match="already"):
            coordinator.collect_ahead()
        pusher = threading.Thread(target=coordinator.push_weights, args=({}, 1))
        pusher.start()
        pusher.join(0.3)
        assert pusher.is_alive() and sync.prepared == [1] and sync.pushed == []  # the engines wait for the rollout
        collector.gate.set()
        pusher.join(10)
        assert sync.pushed == [1]
        assert coordinator.take_ahead_wait() > 0.2 and coordinator.take_ahead_wait() == 0.0
        result = coordinator.collect()  # the rollout made ahead, not a new one
        assert result.train_rewards == [1.0] and coordinator.source.position == 8
        assert coordinator.data_position() == {"position": 8}
    finally:
        coordinator.close()


@pytest.mark.slow
def test_async_quickstart_trains_one_version_behind(tmp_path: Path):
    run = tmp_path / "a"
    out = run_train(run, "trainer.async_rollout=true", "trainer.max_steps=4", "trainer.nproc=1",
                    "eval.at_start=false", "eval.at_end=false", "observe.report=false")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # step 1 trains on the first rollout (generated by the initial weights); every later step on a rollout
    # generated while the step before it trained, by the weights one version behind
    assert [r["rollout/staleness_max"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert all(r["rollout/stale_dropped"] == 0.0 for r in rows)
    assert (run / "final" / "model.safetensors").is_file()


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


class VersionSeen:
    """A rollout that records which weights the engine held when it started."""

    def __init__(self, engine: GatedEngine) -> None:
        self.engine = engine
        self.seen: list[list[str]] = []

    async def collect(self) -> RolloutResult:
        self.seen.append(list(self.engine.loaded))
        return RolloutResult([Sample(index=0)], [1.0], {"reward/mean": 1.0})


@pytest.mark.parametrize("overlapped", [True, False])
def test_a_disk_push_lets_the_trainer_go_on_while_the_engines_load(tmp_path: Path, overlapped: bool):
    from safetensors.torch import load_file

    from tests.helpers.teacher import make_checkpoint

    ckpt = make_checkpoint(tmp_path / "model", seed=0)
    state = load_file(str(ckpt / "model.safetensors"))
    cfg = load([f"model.path={ckpt}", f"trainer.async_rollout={str(overlapped).lower()}"])
    coordinator = RolloutCoordinator(with_free_ports(cfg), tmp_path / "run", tokenizer=None)
    try:
        engine = GatedEngine()
        coordinator.engines = [engine]
        collector = VersionSeen(engine)
        coordinator.driver = collector
        pusher = threading.Thread(target=coordinator.push_weights, args=(state, 1))
        pusher.start()
        pusher.join(0.5)
        if not overlapped:  # a synchronous step's push returns once the engines hold the weights
            assert pusher.is_alive() and engine.loaded == []
            engine.gate.set()
            pusher.join(10)
            assert engine.loaded == ["1"] and coordinator.delivery is None
            return
        assert not pusher.is_alive() and engine.loaded == []  # returned: the engine is still loading
        assert (tmp_path / "run" / "weights" / "v1" / "model.safetensors").is_file()
        coordinator.collect_ahead()
        time.sleep(0.3)
        assert collector.seen == []  # the rollout ahead waits for the weights just pushed
        engine.gate.set()
        assert coordinator.collect().train_rewards == [1.0] and collector.seen == [["1"]]

        engine.gate.clear()
        engine.refuse = True
        coordinator.push_weights(state, 2)
        engine.gate.set()
        with pytest.raises(RuntimeError, match="refused weights .*no room"):
            coordinator.settle()  # what evaluate and the next push do first
        engine.gate.clear()
        coordinator.push_weights(state, 3)
        coordinator.collect_ahead()
        engine.gate.set()
        with pytest.raises(RuntimeError, match="refused weights"):
            coordinator.collect()  # the rollout ahead carries the engines' error
        assert collector.seen == [["1"]]  # and never ran on weights the engine does not hold
    finally:
        engine.gate.set()
        coordinator.close()
