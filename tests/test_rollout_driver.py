"""Rank 0's rollout against a real engine: groups, rewards, the zero-std filter with over-sampling."""

from __future__ import annotations

import asyncio

import pytest

from slimecli.config.compose import load
from slimecli.model.loading import load_tokenizer
from slimecli.rollout import driver as driver_module
from slimecli.rollout.client import EngineClient
from slimecli.rollout.data import PromptSource
from slimecli.rollout.driver import RolloutDriver, sample_seed
from slimecli.rollout.sample import Status
from tests.helpers.engine import Engine


@pytest.fixture(scope="module")
def live_engine(engine: Engine) -> Engine:
    return engine  # the session's shared engine: these tests only generate


class Counting(EngineClient):
    """The real client, noting the sequences (a batch's length, or n) and seeds of every /generate it sends."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.copies: list[int] = []
        self.seeds: list[int | None] = []

    async def generate(self, *args, **kw):
        params = kw["sampling_params"]
        self.copies.append(len(params) if isinstance(params, list) else params.get("n", 1))
        self.seeds += [p.get("sampling_seed") for p in (params if isinstance(params, list) else [params])]
        return await super().generate(*args, **kw)


def _collect(engine: Engine, tmp_path, *overrides: str, client_out: list | None = None):
    reward = tmp_path / "r.py"
    reward.write_text("def score(s):\n    return 1.0 if s.group_index % 2 == 0 else (s.index % 3) / 2\n")
    cfg = load([f"model.path={engine.model_path}", "rollout.batch_size=3", "rollout.n_samples_per_prompt=4",
                "trainer.global_batch_size=12", "trainer.micro_batch_size=4", "trainer.nproc=1",
                "rollout.max_new_tokens=6", "reward=python", f"reward.path={reward}:score", *overrides])

    async def go():
        async with Counting(engine.url) as client:
            if client_out is not None:
                client_out.append(client)
            driver = RolloutDriver(cfg, load_tokenizer(engine.model_path), [client], PromptSource(cfg.task, 7))
            return await driver.collect(), driver.source.position

    return asyncio.run(go())


def test_groups_have_consistent_samples(live_engine, tmp_path):
    result, consumed = _collect(live_engine, tmp_path)
    assert consumed == 3 and len(result.samples) == 12 and len(result.train_rewards) == 12
    for s in result.samples:
        assert s.response_length == len(s.rollout_log_probs) == len(s.loss_mask) >= 1
        assert len(s.tokens) == s.prompt_length + s.response_length
        assert all(lp <= 0 for lp in s.rollout_log_probs)
        assert s.status in (Status.COMPLETED, Status.TRUNCATED) and s.weight_versions == ["default"]
    assert [s.group_index for s in result.samples] == [g for g in range(3) for _ in range(4)]
    assert result.metrics["reward/count"] == 12 and "rollout/response_len_mean" in result.metrics


def test_zero_std_filter_drops_constant_groups_and_oversamples(live_engine, tmp_path):
    result, consumed = _collect(live_engine, tmp_path, "rollout.dynamic_filter=zero_std")
    assert {s.group_index % 2 for s in result.samples} == {1}  # every kept group has reward variance
    assert len(result.samples) == 12 and consumed > 3
    assert result.metrics["rollout/dropped_zero_std"] >= 3
    assert result.metrics["filter/drop/zero_std"] == result.metrics["rollout/dropped_zero_std"]
    indices = [s.index for s in result.samples]
    assert indices == sorted(indices)


@pytest.mark.parametrize("max_copies, requests", [(64, [4, 4, 4]), (3, [3, 1, 3, 1, 3, 1])])
def test_a_group_is_asked_for_in_one_request(live_engine, tmp_path, monkeypatch, max_copies, requests):
    monkeypatch.setattr(driver_module, "MAX_COPIES", max_copies)
    clients: list = []
    result, _ = _collect(live_engine, tmp_path, client_out=clients)
    assert sorted(clients[0].copies) == sorted(requests)  # the group's samples, at most MAX_COPIES a request
    groups = [[s for s in result.samples if s.group_index == g] for g in range(3)]
    assert all(len(g) == 4 and len({tuple(s.tokens[:s.prompt_length]) for s in g}) == 1 for g in groups)
    assert any(len({tuple(s.tokens) for s in g}) > 1 for g in groups)  # the copies are sampled independently, not one answer repeated


def test_each_sample_has_its_own_seed_and_the_same_draw_repeats_the_same_rollout(live_engine, tmp_path):
    """The seeds name (run.seed, prompt position, sample index): a second driver (a resumed run's, with a fresh
    prompt source at the same position), its requests batched otherwise by the engine, draws the very same
    tokens; another run.seed gives other seeds."""
    clients: list = []
    first, _ = _collect(live_engine, tmp_path, client_out=clients)
    again, _ = _collect(live_engine, tmp_path, "rollout.max_running_requests=1", client_out=clients)  # other batches
    seeds = clients[0].seeds
    assert None not in seeds and len(set(seeds)) == 12 and sorted(seeds) == sorted(clients[1].seeds)
    assert [s.tokens for s in first.samples] == [s.tokens for s in again.samples]
    for a, b in zip(first.samples, again.samples, strict=True):  # other batch shapes: float rounding only
        assert a.rollout_log_probs == pytest.approx(b.rollout_log_probs, abs=1e-5)
    assert sample_seed(1234, "rollout", 0, 0) in seeds and sample_seed(99, "rollout", 0, 0) not in seeds
