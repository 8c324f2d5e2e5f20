"""reward.judge_api=teacher: the teacher server judges by its log-probs (slimecli/reward/judge_teacher.py). A scripted
teacher on loopback gives the expected rewards; the real `slimecli teacher serve` judges with no verdict unparsed;
the verdict forms it cannot pick among are refused naming the field."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from slimecli.config.compose import load
from slimecli.config.errors import ConfigErrors
from slimecli.config.groups.reward import RewardConfig
from slimecli.model.loading import load_tokenizer
from slimecli.reward import assign_rewards, reward_metrics
from slimecli.reward.judge import CACHE
from slimecli.rollout.sample import Sample
from tests.helpers import free_port
from tests.helpers.teacher import Server

LOG = logging.getLogger("test_judge_teacher")


@pytest.fixture(autouse=True)
def empty_cache():
    CACHE.clear()
    yield
    CACHE.clear()


def samples(*answers: str) -> list[Sample]:
    return [Sample(index=i, group_index=i, prompt=f"question {i}", response=answer, label=None)
            for i, answer in enumerate(answers)]


class ScriptedTeacher:
    """The teacher API's /info and /generate: every token scores 0 when the text ends with the verdict the answer
    asks for (PASS for GOOD, FAIL otherwise; for scores, the digit after SCORE), else -1 each."""

    def __init__(self, model: Path) -> None:
        self.model, self.tok = model, load_tokenizer(str(model))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.generate_bodies: list[dict[str, Any]] = []
        self.info_calls = 0

    async def info(self, request: web.Request) -> web.Response:
        self.info_calls += 1
        return web.json_response({"server_type": "slimecli-teacher", "model_path": str(self.model)})

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.generate_bodies.append(body)
        ids = body["input_ids"]
        text = self.tok.decode(ids)
        wanted = "PASS" if "GOOD" in text else "FAIL"
        if "SCORE" in text:
            wanted = text.split("SCORE", 1)[1][0]
        score = 0.0 if text.endswith(wanted) else -1.0
        return web.json_response({"request_id": "r", "log_probs": [score] * (len(ids) - 1)})

    async def __aenter__(self) -> ScriptedTeacher:
        app = web.Application()
        app.router.add_get("/info", self.info)
        app.router.add_post("/generate", self.generate)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()


BASE = RewardConfig(name="judge", judge_url="http://unused", judge_api="teacher", max_retries=1, backoff_s=0.0,
                    timeout_s=30)


def judged(cfg: RewardConfig, batch: list[Sample], model: Path) -> ScriptedTeacher:
    async def main() -> ScriptedTeacher:
        async with ScriptedTeacher(model) as teacher:
            await assign_rewards(batch, replace(cfg, judge_url=teacher.url), LOG)
            return teacher

    return asyncio.run(main())


def test_the_likeliest_verdict_is_the_reward(tiny: Path):
    batch = samples("a GOOD answer", "a bad answer", "GOOD again")
    teacher = judged(BASE, batch, tiny)
    assert [s.reward for s in batch] == [1.0, 0.0, 1.0]
    assert [s.metadata["judge"]["verdict"] for s in batch] == ["PASS", "FAIL", "PASS"]
    assert teacher.info_calls == 1  # the tokenizer is the teacher's own, read once
    assert len(teacher.generate_bodies) == 6  # each answer: PASS and FAIL scored
    tok = load_tokenizer(str(tiny))
    pass_ids = tok.encode("PASS", add_special_tokens=False)
    assert any(b["input_ids"][-len(pass_ids):] == pass_ids for b in teacher.generate_bodies)
    assert reward_metrics(batch)["reward/judge_errors"] == 0.0

    scored = samples("SCORE3 please", "SCORE0 then")
    judged(replace(BASE, verdict="score", score_max=4), scored, tiny)
    assert [s.reward for s in scored] == [0.75, 0.0]


def test_verdict_forms_the_teacher_cannot_pick_among_are_refused():
    with pytest.raises(ConfigErrors) as exc:
        load(["reward=judge", "reward.judge_url=http://127.0.0.1:9", "reward.judge_api=teacher",
              "reward.verdict_regex='(YES|NO)'", "reward.verdict=score", "reward.score_max=2.5"])
    text = str(exc.value)
    assert "reward.verdict_regex" in text and "no free-form verdict" in text
    assert "reward.score_max" in text and "whole number up to 100" in text
    with pytest.raises(ConfigErrors, match="reward.judge_api"):
        load(["reward=judge", "reward.judge_url=embedded", "reward.judge_api=teacher"])


@pytest.mark.slow
def test_the_real_teacher_server_judges_every_sample(tmp_path: Path, tiny: Path):
    """`slimecli teacher serve` on the tiny model: every verdict is one of the candidates, none unparsed."""
    srv = Server(tmp_path, [f"teacher.model_path={tiny}"])
    try:
        srv.wait_ready()
        batch = samples("yes", "no", "maybe")
        asyncio.run(assign_rewards(batch, replace(BASE, judge_url=srv.url), LOG))
        assert all(s.metadata["judge"]["verdict"] in ("PASS", "FAIL") for s in batch), [s.metadata for s in batch]
        assert all(s.reward in (0.0, 1.0) for s in batch)
        scored = samples("one", "two")
        asyncio.run(assign_rewards(scored, replace(BASE, judge_url=srv.url, verdict="score", score_max=3), LOG))
        assert all(s.reward in (0.0, 1 / 3, 2 / 3, 1.0) for s in scored), [s.reward for s in scored]
        assert reward_metrics(batch + scored)["reward/judge_errors"] == 0.0
    finally:
        srv.stop()
