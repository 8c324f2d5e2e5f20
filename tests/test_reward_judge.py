"""reward=judge against a scripted judge on loopback (tests/helpers/scripted_judge.py): the rewards its verdicts
stand for, the constraint each API is sent, a garbled verdict and a judge that is down counted in
reward/judge_errors (never raised), retries, the cache, and the verdict parser on its own."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace

import pytest

from slimecli.config.groups.reward import RewardConfig
from slimecli.eval.scoring import Outcome, dataset_metrics
from slimecli.reward import assign_rewards, reward_metrics, sample_reward
from slimecli.reward.judge import CACHE, judge_api
from slimecli.reward.verdict import VerdictError, VerdictForm, compile_form, render
from slimecli.rollout.sample import Sample
from tests.helpers import free_port
from tests.helpers.scripted_judge import ScriptedJudge

LOG = logging.getLogger("test_judge")
SCHEMA = json.dumps({"type": "object", "properties": {"verdict": {"type": "integer", "minimum": 0, "maximum": 10}},
                     "required": ["verdict"]})


@pytest.fixture(autouse=True)
def empty_cache():
    CACHE.clear()
    yield
    CACHE.clear()


def samples(*answers: str) -> list[Sample]:
    return [Sample(index=i, group_index=i, prompt=[{"role": "user", "content": f"question {i}"}], response=answer,
                   label=f"label {i}") for i, answer in enumerate(answers)]


def judged(cfg: RewardConfig, batch: list[Sample], judge: ScriptedJudge | None = None, url_suffix: str = ""):
    """assign_rewards with the judge at judge.url (+ suffix); returns the judge and its metrics."""
    async def main():
        async with (judge or ScriptedJudge()) as server:
            await assign_rewards(batch, replace(cfg, judge_url=server.url + url_suffix), LOG)
            return server

    server = asyncio.run(main())
    return server, reward_metrics(batch)


BASE = RewardConfig(name="judge", judge_url="http://unused", max_retries=2, backoff_s=0.0, timeout_s=10)


def test_pass_fail_verdicts_become_rewards_and_a_garbled_one_is_counted():
    batch = samples("GOOD answer", "BAD answer", "GARBLED answer", "FLAKY but GOOD", "something else")
    judge, metrics = judged(BASE, batch)
    assert [s.reward for s in batch] == [1.0, 0.0, None, 1.0, 0.0]
    assert batch[2].metadata["reward_error"] == "VerdictUnparsed"
    assert batch[2].metadata["judge"]["error"] == "unparsed"
    assert "neither" not in batch[2].metadata["judge"]["detail"]  # no regex match at all
    assert batch[2].metadata["judge"]["verdict"] == "I cannot decide, sorry"
    assert metrics["reward/judge_errors"] == 1.0 and metrics["reward/judge_errors/unparsed"] == 1.0
    assert metrics["reward/judge_calls"] == 5.0 and metrics["reward/invalid/reward_error"] == 1.0
    assert judge.seen["FLAKY but GOOD"] == 2  # the 500 was retried
    # SGLang's native API: the rubric filled in, the verdict's regex as the constraint, greedy
    body = next(b for b in judge.requests if "BAD answer" in b["text"])
    assert body["sampling_params"] == {"max_new_tokens": 256, "temperature": 0.0, "regex": "(PASS|FAIL)"}
    assert "question 1" in body["text"] and "label 1" in body["text"] and "Reply with only PASS" in body["text"]
    assert set(judge.paths) == {"/generate"}


def test_a_judge_that_is_down_is_counted_never_raised():
    batch = samples("DOWN", "GOOD")
    judge, metrics = judged(BASE, batch)
    assert batch[0].reward is None and batch[1].reward == 1.0
    assert batch[0].metadata["judge"]["error"] == "unavailable"
    assert "failed after 3 attempts" in batch[0].metadata["judge"]["detail"]
    assert judge.seen["DOWN"] == 3  # reward.max_retries=2 after the first
    assert metrics["reward/judge_errors/unavailable"] == 1.0 and metrics["reward/judge_errors"] == 1.0

    nobody = samples("GOOD", "BAD")  # nothing listens there at all
    asyncio.run(assign_rewards(nobody, replace(BASE, judge_url=f"http://127.0.0.1:{free_port()}", max_retries=0), LOG))
    assert [s.reward for s in nobody] == [None, None]
    assert reward_metrics(nobody)["reward/judge_errors/unavailable"] == 2.0

    unpicked = samples("GOOD")  # an embedded judge outside the run that started it (no port picked)
    asyncio.run(assign_rewards(unpicked, replace(BASE, judge_url="embedded"), LOG))
    assert unpicked[0].reward is None and "no port was picked" in unpicked[0].metadata["judge"]["detail"]
    assert reward_metrics(unpicked)["reward/judge_errors/unavailable"] == 1.0


def test_openai_api_with_a_json_schema_score_and_an_api_key():
    cfg = replace(BASE, verdict="score", verdict_schema=SCHEMA, judge_model="grader", judge_api_key="k3y")
    batch = samples("SCORE7", "SCORE10", "SCORE12", "GARBLED")
    judge, metrics = judged(cfg, batch, ScriptedJudge(api_key="k3y"), url_suffix="/v1")
    assert [s.reward for s in batch][:2] == [0.7, 1.0]
    assert batch[2].reward is None and "outside 0..reward.score_max=10" in batch[2].metadata["judge"]["detail"]
    assert batch[3].metadata["judge"]["error"] == "unparsed"
    assert metrics["reward/judge_errors/unparsed"] == 2.0
    assert set(judge.paths) == {"/v1/chat/completions"}
    body = judge.requests[0]
    assert body["model"] == "grader" and body["max_tokens"] == 256
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "verdict", "schema": json.loads(SCHEMA)}}
    wrong_key = samples("GOOD")
    judged(replace(cfg, judge_api_key="nope"), wrong_key, ScriptedJudge(api_key="k3y"), url_suffix="/v1")
    assert "rejected the request" in wrong_key[0].metadata["judge"]["detail"]  # a 401 is not retried


def test_verdicts_are_cached_by_prompt_response_and_rubric():
    cfg = replace(BASE, rubric="Grade strictly.\nAnswer to grade:\n{response}\n\n{instruction}")

    async def main():
        async with ScriptedJudge() as judge:
            at = replace(cfg, judge_url=judge.url)
            first = samples("GOOD", "BAD", "GARBLED")
            await assign_rewards(first, at, LOG)
            assert len(judge.requests) == 3
            again = samples("GOOD", "BAD", "GARBLED")
            await assign_rewards(again, at, LOG)
            assert len(judge.requests) == 4  # only the unparsed one is asked again
            assert [s.reward for s in again] == [1.0, 0.0, None]
            metrics = reward_metrics(again)
            assert metrics["reward/judge_cached"] == 2.0 and again[0].metadata["judge"]["cached"] is True
            other = samples("GOOD")
            other[0].prompt = "another prompt"
            await assign_rewards(other, replace(at, rubric=cfg.rubric + " {prompt}"), LOG)
            assert len(judge.requests) == 5  # another rubric and prompt: another verdict
            await assign_rewards(samples("GOOD"), replace(at, judge_max_tokens=8), LOG)
            assert len(judge.requests) == 6  # other verdict settings too
            await assign_rewards(samples("GOOD"), replace(at, judge_cache_size=0), LOG)
            await assign_rewards(samples("GOOD"), replace(at, judge_cache_size=0), LOG)
            assert len(judge.requests) == 8  # no cache
            twins = samples("GOOD twin", "GOOD twin", "GOOD twin", "DOWN twin", "DOWN twin")
            await assign_rewards(twins, replace(at, max_retries=0), LOG)
            assert len(judge.requests) == 10  # one request for the three alike, one for the two alike
            assert [s.reward for s in twins] == [1.0, 1.0, 1.0, None, None]
            assert sorted(bool(s.metadata["judge"].get("cached")) for s in twins[:3]) == [False, True, True]
            assert reward_metrics(twins)["reward/judge_errors/unavailable"] == 2.0

    asyncio.run(main())


def test_concurrency_bounds_requests_in_flight():
    class Counting(ScriptedJudge):
        in_flight = peak = 0

        async def generate(self, request):
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            await asyncio.sleep(0.02)
            try:
                return await super().generate(request)
            finally:
                self.in_flight -= 1

    batch = samples(*[f"GOOD {i}" for i in range(12)])
    judge, _ = judged(replace(BASE, concurrency=3), batch, Counting())
    assert [s.reward for s in batch] == [1.0] * 12
    assert 1 <= judge.peak <= 3


def test_eval_dataset_metrics_count_judge_errors():
    batch = samples("GOOD", "GARBLED")
    judged(BASE, batch)
    outcomes = []
    for i, s in enumerate(batch):
        value = sample_reward(s)
        outcomes.append(Outcome(i, 0, {}, [s], value if isinstance(value, float) else None))
    out = dataset_metrics(outcomes, 1, 1.0)
    assert out["judge_errors"] == 1.0 and out["judge_calls"] == 2.0 and out["invalid"] == 0.5


def test_the_api_is_picked_by_the_url():
    assert judge_api(replace(BASE, judge_url="http://h:30000")) == "generate"
    assert judge_api(replace(BASE, judge_url="https://api.example.com/v1")) == "openai"
    assert judge_api(replace(BASE, judge_url="http://h:8000/v1/chat/completions")) == "openai"
    assert judge_api(replace(BASE, judge_url="embedded")) == "generate"
    assert judge_api(replace(BASE, judge_url="http://h/v1", judge_api="generate")) == "generate"


@pytest.mark.parametrize(("form", "text", "value"), [
    (VerdictForm("pass_fail", "(PASS|FAIL)", None), "PASS", 1.0),
    (VerdictForm("pass_fail", "(PASS|FAIL)", None), " FAIL\n", 0.0),
    (VerdictForm("pass_fail", "(PASS|FAIL)", None), "Reasoning... so: PASS. Wait, no: FAIL", 0.0),  # the last
    (VerdictForm("pass_fail", r"[\s\S]*VERDICT: (?P<verdict>YES|NO)", None), "it holds.\nVERDICT: YES", 1.0),
    (VerdictForm("score", r"([0-9]{1,3}(\.[0-9]{1,2})?)", None), "7.5", 0.75),
    (VerdictForm("score", r"Score: (\d+)", None, score_max=5), "Score: 4", 0.8),
    (VerdictForm("pass_fail", None, '{"x":1}'), '{"verdict": "pass"}', 1.0),
    (VerdictForm("pass_fail", None, '{"x":1}'), 'here: {"verdict": false} done', 0.0),
    (VerdictForm("score", None, '{"x":1}'), '{"verdict": 3}', 0.3),
])
def test_verdicts_parse(form, text, value):
    assert form.parse(text) == pytest.approx(value)


@pytest.mark.parametrize(("form", "text", "why"), [
    (VerdictForm("pass_fail", "(PASS|FAIL)", None), "maybe", "no match"),
    (VerdictForm("pass_fail", r"(\w+)", None), "perhaps", "neither pass nor fail"),
    (VerdictForm("score", r"(\S+)", None), "eleven", "not a number"),
    (VerdictForm("score", r"(\d+)", None), "11", "outside 0..reward.score_max=10"),
    (VerdictForm("score", None, "{}"), "{not json", "not JSON"),
    (VerdictForm("score", None, "{}"), '{"score": 3}', "has no 'verdict'"),
    (VerdictForm("score", None, "{}"), '{"verdict": true}', "not a number"),
])
def test_unparseable_verdicts_say_why(form, text, why):
    with pytest.raises(VerdictError, match=why):
        form.parse(text)


def test_the_rubric_is_filled_in_and_other_braces_stay():
    form = compile_form(RewardConfig(name="judge", verdict="score"))
    text = render('Q: {prompt}\nA: {response}\nRef: {label}\nJSON like {"a": 1}\n{instruction}', form,
                  [{"role": "user", "content": "hi"}], "HELLO", None)
    assert text == ('Q: user: hi\nA: HELLO\nRef: \nJSON like {"a": 1}\n'
                    "Reply with only a score from 0 to 10 (higher is better).")
    schema = compile_form(RewardConfig(name="judge", verdict_schema=SCHEMA))
    assert schema.constraint == ("json_schema", json.dumps(json.loads(SCHEMA), separators=(",", ":")))
    assert "JSON object following this schema" in schema.instruction()


def test_the_embedded_judge_is_planned_when_a_reward_uses_it(tmp_path):
    """reward.judge_url=embedded: a free port picked, a `judge` server in the plan before the trainer, probed like
    an engine (what it serves: test_reward_judge_embedded.py); also when only an eval dataset is judged."""
    from slimecli.config.eval_settings import dataset_reward
    from slimecli.config.layout import embedded_judge
    from slimecli.launch.free_ports import with_free_ports
    from slimecli.launch.plan import build_plan
    from slimecli.launch.source_checks import load

    cfg = with_free_ports(load(["reward=judge", "reward.judge_model=/models/grader", f"run.root={tmp_path}"]))
    port = cfg.reward.judge_port
    assert isinstance(port, int)
    plan = build_plan(cfg, tmp_path)
    assert [s.name for s in plan] == ["engine-0", "judge", "trainer"]
    judge = plan[1]
    assert judge.kind == "server" and judge.ports == [port] and judge.argv[-1] == "--judge"
    assert judge.probe is not None and judge.probe.url == f"http://127.0.0.1:{port}/health_generate"
    assert judge.health is not None and judge.health.url == judge.probe.url  # kept alive like the engines
    assert (judge.health.max_restarts, judge.health.setting) == (cfg.rollout.max_restarts, "rollout.max_restarts")

    rubric = "Is this upper case? {response}\n{instruction}"
    datasets = ("eval.datasets=[{name: h, task: quickstart, reward: {name: judge, verdict: score, "
                f"rubric: '{rubric}'}}}}]")
    only_eval = with_free_ports(load([datasets, f"run.root={tmp_path}"]))
    assert only_eval.reward.name == "quickstart" and embedded_judge(only_eval) is not None
    scoped = dataset_reward(only_eval.eval.datasets[0], only_eval.reward)
    assert (scoped.name, scoped.verdict, scoped.rubric) == ("judge", "score", rubric)
    assert scoped.judge_port == only_eval.reward.judge_port and isinstance(scoped.judge_port, int)
    assert "judge" in [s.name for s in build_plan(only_eval, tmp_path)]
    assert "judge" not in [s.name for s in build_plan(with_free_ports(load([f"run.root={tmp_path}"])), tmp_path)]
    remote = with_free_ports(load(["reward=judge", "reward.judge_url=http://127.0.0.1:1", f"run.root={tmp_path}"]))
    assert embedded_judge(remote) is None and "judge" not in [s.name for s in build_plan(remote, tmp_path)]
