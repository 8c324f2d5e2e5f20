"""The evaluator against stand-in engines: per-dataset sampling, stop strings and rewards reach the engine and
the scores; a dataset that fails is reported and the others still run; SWE task sets are worked by agent runs
(run_task scripted, as in the agent rollout tests) and give the resolved rate and pass@k."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import textwrap

import pytest

from slimecli.agent.training import collector as agent_rollout
from slimecli.config.compose import load
from slimecli.eval.runner import Evaluator, flat_metrics, headline, read_summary
from slimecli.rollout.driver import sample_seed
from slimecli.rollout.sample import Sample, Status


class Engine:
    """Answers each sample asked for (a batch entry, or one of sampling_params.n copies) with "HELLO" and "nope"
    in turn; records every sample's sampling params."""

    base_url = "http://127.0.0.1:1"

    def __init__(self, tok):
        self.tok = tok
        self.requests: list[dict] = []
        self.calls: list[int] = []  # the samples each /generate asked for

    async def generate(self, input_ids, sampling_params, return_logprob=True):
        batch = isinstance(sampling_params, list)
        self.calls.append(len(sampling_params) if batch else sampling_params.get("n", 1))
        each = sampling_params if batch else [sampling_params] * sampling_params.get("n", 1)
        replies = []
        for params in each:
            self.requests.append(dict(params))
            text = "HELLO" if len(self.requests) % 2 else "nope"
            ids = self.tok.encode(text)
            replies.append({"text": text, "meta_info": {"output_token_logprobs": [[-0.5, i, None] for i in ids],
                                                        "finish_reason": {"type": "stop"}, "weight_version": "7"}})
        return replies if batch or len(each) > 1 else replies[0]


def recipe(tmp_path, body: str) -> str:
    path = tmp_path / "r.yaml"
    path.write_text("# @package _global_\n" + textwrap.dedent(body))
    return f"+recipe={path}"


def test_single_turn_datasets_with_their_overrides(tmp_path, tok):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"q": f"say hello {i}", "a": "HELLO"}) + "\n" for i in range(5)))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"nothing": 1}\n')
    cfg = load([recipe(tmp_path, f"""
        eval:
          at_start: false
          at_end: true
          datasets:
            - name: caps
              task: jsonl
              path: {data}
              prompt_key: q
              label_key: a
              max_samples: 3
              n_samples_per_prompt: 4
              temperature: 0.5
              stop: ["!"]
              reward: {{name: exact_match}}
            - {{name: broken, task: jsonl, path: {bad}}}
            - {{name: heldout, task: quickstart, max_samples: 2, n_samples_per_prompt: 2}}
        """)])
    engine = Engine(tok)
    evaluator = Evaluator(cfg, tok, [engine], tmp_path / "run")
    assert evaluator.due(0, 10) is False and evaluator.due(10, 10) is True and evaluator.due(5, 10) is False
    results = asyncio.run(evaluator.evaluate(10))
    caps, broken, heldout = results
    assert caps.error is None and broken.error is not None and "no 'q' field" not in broken.error
    assert "no 'prompt' field" in broken.error and heldout.error is None
    first = engine.requests[:12]
    assert all(r["temperature"] == 0.5 and r["stop"] == ["!"] for r in first)
    assert all(r["temperature"] == cfg.rollout.temperature and "stop" not in r for r in engine.requests[12:])
    assert len({r["sampling_seed"] for r in engine.requests}) == len(engine.requests) == 16  # a seed per sample
    assert engine.calls == [12, 4]  # a dataset's samples in one request (up to rollout.max_running_requests)
    seeds = [sample_seed(cfg.run.seed, "eval", "caps", i, j) for i in range(3) for j in range(4)]
    assert [r["sampling_seed"] for r in first] == seeds  # each sample's own: its dataset, prompt and index
    assert caps.metrics["samples"] == 12 and caps.metrics["prompts"] == 3
    assert caps.metrics["reward_mean"] == pytest.approx(0.5)  # exact_match against the label: every other answer
    assert caps.metrics["pass@1"] == pytest.approx(0.5) and caps.metrics["pass@4"] == pytest.approx(1.0)
    assert heldout.metrics["samples"] == 4 and heldout.metrics["reward_mean"] == pytest.approx(0.5)  # uppercase share
    flat = flat_metrics(results)
    assert flat["eval/caps/failed"] == 0.0 and flat["eval/broken/failed"] == 1.0 and "eval/broken/reward_mean" not in flat
    assert "eval caps 0.500" in headline(results) and "eval broken failed" in headline(results)
    rows = [json.loads(line) for line in (tmp_path / "run" / "eval" / "step_10" / "caps.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and rows[0]["label"] == "HELLO" and rows[0]["prompt"] == "say hello 0"
    assert {r["passed"] for r in rows} == {True, False}
    summary = read_summary(tmp_path / "run", 10)
    assert [d["name"] for d in summary["datasets"]] == ["caps", "broken", "heldout"]
    assert summary["datasets"][1]["error"] == broken.error


def test_an_evaluation_spreads_its_requests_over_the_engines_and_encodes_each_prompt_once(tmp_path, tok, monkeypatch):
    """12 samples, 2 engines, at most 5 sequences a request: requests of 5, 5 and 2 in turn over the engines,
    each reply to its own sample; a second evaluation encodes no prompt again."""
    from slimecli.rollout.driver import RolloutDriver

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"q": f"say hello {i}", "a": "HELLO"}) + "\n" for i in range(3)))
    cfg = load([recipe(tmp_path, f"""
        rollout: {{max_running_requests: 5}}
        eval:
          at_start: false
          datasets:
            - {{name: caps, task: jsonl, path: {data}, prompt_key: q, label_key: a, n_samples_per_prompt: 4,
                reward: {{name: exact_match}}}}
        """)])
    encoded: list[str] = []
    encode = RolloutDriver.encode_prompt
    monkeypatch.setattr(RolloutDriver, "encode_prompt", lambda self, prompt: encoded.append(prompt) or encode(self, prompt))
    engines = [Engine(tok), Engine(tok)]
    evaluator = Evaluator(cfg, tok, engines, tmp_path / "run")
    (caps,) = asyncio.run(evaluator.evaluate(1))
    assert [e.calls for e in engines] == [[5, 2], [5]] and caps.error is None
    assert caps.metrics["samples"] == 12 and caps.metrics["reward_mean"] == pytest.approx(7 / 12)  # HELLO: 3+1+3
    assert encoded == ["say hello 0", "say hello 1", "say hello 2"]
    asyncio.run(evaluator.evaluate(2))
    assert len(encoded) == 3 and [len(e.calls) for e in engines] == [4, 2]


GRADES = {0: {"resolved": 1, "f2p": 1.0, "p2p": 1.0, "applied": 1, "touched_tests": 0, "reward": 1.0},
          1: {"resolved": 0, "f2p": 0.0, "p2p": 1.0, "applied": 1, "touched_tests": 0, "reward": 0.0}}


class FakeService:
    """The adapter the evaluator starts in front of the engines (run_task is scripted, so nothing talks to it)."""

    started = stopped = 0

    def __init__(self, cfg, port, engine_urls):
        self.engine_urls = engine_urls

    async def start(self):
        FakeService.started += 1

    async def stop(self):
        FakeService.stopped += 1


def test_swe_task_sets_give_the_resolved_rate_and_pass_at_k(tmp_path, tok, monkeypatch):
    from slimecli.agent.api import service

    async def run_task(service, job, *, base_sample: Sample, **_):
        await asyncio.sleep(0)
        if base_sample.index == 5:  # one run the infrastructure lost on every attempt
            return [Sample.aborted("exception:boom", prompt=base_sample.prompt, index=base_sample.index,
                                   metadata=dict(base_sample.metadata))]
        grade = GRADES[base_sample.index % 2] if base_sample.group_index == 0 else GRADES[1]
        return [dataclasses.replace(base_sample, tokens=[1, 2, 3], response_length=2, loss_mask=[1, 1],
                                    rollout_log_probs=[-0.1, -0.1], reward=dict(grade), status=Status.COMPLETED)]

    monkeypatch.setattr(agent_rollout, "run_task", run_task)
    monkeypatch.setattr(service, "AgentService", FakeService)
    cfg = load(["agent=codex", "agent.max_retries=0", recipe(tmp_path, """
        eval:
          datasets:
            - {name: tiny, task: swe, path: "builtin:swe_tiny", max_samples: 3, n_samples_per_prompt: 2}
        """)])
    evaluator = Evaluator(cfg, tok, [Engine(tok)], tmp_path / "run")
    evaluator.job_factory = lambda task: task
    (result,) = asyncio.run(evaluator.evaluate(3))
    assert result.error is None, result.error
    m = result.metrics
    # task 0: one of 2 runs resolved; task 1: none; task 2: one valid run (unresolved), one aborted
    assert m["samples"] == 6 and m["invalid"] == pytest.approx(1 / 6)
    assert m["resolved_rate"] == pytest.approx(1 / 5) and m["reward_mean"] == pytest.approx(1 / 5)
    assert m["pass@1"] == pytest.approx((0.5 + 0 + 0) / 3) and m["pass@2"] == pytest.approx((1 + 0) / 2)
    assert FakeService.started == FakeService.stopped == 1
    rows = [json.loads(line) for line in (tmp_path / "run" / "eval" / "step_3" / "tiny.jsonl").read_text().splitlines()]
    assert all(r["instance_id"].startswith("tiny-") for r in rows)
    assert [r["invalid"] for r in rows].count("exception:boom") == 1
