"""Evaluation on RL environments: an eval dataset with `env` (its config rules), its episodes on the environment's
eval split scored by the evaluator against the real tiny engine (reward, pass@k, drops, per-sample rows), and
`slimecli eval` with an environment evaluating each source as a dataset."""

from __future__ import annotations

import asyncio
import json
import textwrap
from typing import Any

import pytest

from slimecli.config.errors import ConfigErrors
from slimecli.config.eval_settings import dataset_env
from slimecli.env.builtin.lookup import LookupEnv
from slimecli.env.protocol import StepResult
from slimecli.launch.source_checks import load
from tests.helpers.config_errors import errors_by_key


class RowsLookup(LookupEnv):
    """lookup without tasks of its own (the dataset's path rows are its tasks) whose every answer earns 1."""

    tasks = None  # type: ignore[assignment]

    def _answer(self, word: str) -> StepResult:
        return StepResult(reward=1.0, done=True)


def recipe(tmp_path, body: str) -> str:
    path = tmp_path / "r.yaml"
    path.write_text("# @package _global_\n" + textwrap.dedent(body))
    return f"+recipe={path}"


def test_an_environment_dataset_validates(tmp_path):
    cfg = load([recipe(tmp_path, """
        env: {max_turns: 5, timeout_s: 7}
        eval:
          datasets:
            - {name: lk, env: native, id: lookup, args: {num_tasks: 4}, max_samples: 2, n_samples_per_prompt: 3}
        """)])
    (ds,) = cfg.eval.datasets
    assert (ds.env, ds.id, ds.args, ds.max_samples) == ("native", "lookup", {"num_tasks": 4}, 2)
    env = dataset_env(ds, cfg.env)  # one source labelled by the dataset, its eval split, the run's budgets
    assert [(m.name, m.env, m.id, m.args) for m in env.mix] == [("lk", "native", "lookup", {"num_tasks": 4})]
    assert (env.split, env.max_turns, env.timeout_s) == ("eval", 5, 7)


def test_environment_dataset_rules():
    errors = errors_by_key("eval.datasets=[{name: a, env: native}]")
    assert "needs the environment to load" in errors["eval.datasets[0].id"]
    errors = errors_by_key("eval.datasets=[{name: a, env: native, id: lookup, reward: {name: math}}]")
    assert "the episodes' reward is the reward" in errors["eval.datasets[0].reward"]
    assert "drop eval.datasets[0].reward" in errors["eval.datasets[0].reward"]
    errors = errors_by_key("eval.datasets=[{name: a, env: natve, id: lookup}]")
    assert "did you mean 'native'" in errors["eval.datasets[0].env"] and "eval.datasets[0].path" not in errors
    errors = errors_by_key("eval.datasets=[{name: a, env: native, id: lokup}]")
    assert "did you mean 'lookup'" in errors["eval.datasets[0].id"]
    errors = errors_by_key("eval.datasets=[{name: a, env: native, id: lookup, args: {nope: 1}}]")  # pre-flight: loads
    assert "does not take ['nope']" in errors["eval.datasets[0].id"]
    errors = errors_by_key("eval.datasets=[{name: a, env: native, id: 'tests.test_eval_env:RowsLookup'}]")
    assert "eval.datasets[0].path=FILE.jsonl" in errors["eval.datasets[0].path"]  # no tasks of its own, no rows
    errors = errors_by_key("eval.datasets=[{name: a, id: lookup}]")
    assert "applies to an environment dataset" in errors["eval.datasets[0].id"]


def test_slimecli_eval_evaluates_each_source_of_the_environment():
    from slimecli.eval.standalone import resolve

    cfg, step = resolve(["+recipe=env_lookup", "eval.datasets=[]"])
    assert step == 0 and [(d.name, d.env, d.id) for d in cfg.eval.datasets] == [("lookup", "native", "lookup")]
    cfg, _ = resolve(["env=mix", "env.mix=[{name: a, env: native, id: lookup}, {name: b, env: native, id: lookup, "
                      "args: {seed: 3}}]", "eval.datasets=[]"])
    assert [(d.name, d.args) for d in cfg.eval.datasets] == [("a", {}), ("b", {"seed": 3})]
    cfg, _ = resolve(["env=native", "env.id=lookup", "eval.datasets=[{name: mine, env: native, id: lookup}]"])
    assert [d.name for d in cfg.eval.datasets] == ["mine"]  # a dataset names an environment: as listed
    with pytest.raises(ConfigErrors, match="nothing to evaluate"):
        from slimecli.eval.standalone import evaluate

        evaluate(resolve(["eval.datasets=[]"])[0], 0, [], [])


def test_environment_episodes_are_evaluated_on_the_engine(engine, tok, tmp_path):
    from slimecli.eval.runner import Evaluator, flat_metrics, read_summary
    from slimecli.rollout.client import EngineClient

    rows = tmp_path / "rows.jsonl"  # a secret the environment refuses: its episodes are dropped
    rows.write_text("".join(json.dumps({"id": i, "secret": w}) + "\n" for i, w in enumerate(["moon", "nope"])))
    cfg = load(["+recipe=env_lookup", f"model.path={engine.model_path}", recipe(tmp_path, f"""
        eval:
          datasets:
            - {{name: lookup, env: native, id: lookup, args: {{num_tasks: 8}}, max_samples: 2,
                n_samples_per_prompt: 2}}
            - {{name: rows, env: native, id: 'tests.test_eval_env:RowsLookup', path: '{rows}',
                n_samples_per_prompt: 2}}
        """)])

    async def evaluate() -> list[Any]:
        client = EngineClient(engine.url)
        try:
            return await Evaluator(cfg, tok, [client], tmp_path / "run").evaluate(3)
        finally:
            await client.close()

    lookup, rows_result = asyncio.run(evaluate())
    assert lookup.error is None and rows_result.error is None, (lookup.error, rows_result.error)
    m = lookup.metrics
    assert m["samples"] == 4 and m["prompts"] == 2 and 0.0 <= m["reward_mean"] <= 1.0
    assert {"pass@1", "pass@2"} <= set(m) and 0.0 <= m["pass@1"] <= m["pass@2"] <= 1.0
    assert 1 <= m["turns"] <= cfg.env.max_turns  # the run's env budgets
    m = rows_result.metrics
    assert m["reward_mean"] == 1.0 and m["pass@1"] == 1.0 and m["invalid"] == 0.5
    assert m["dropped"] == 2 and m["dropped/env_error"] == 2
    flat = flat_metrics([lookup, rows_result])
    assert flat["eval/lookup/failed"] == 0.0 and "eval/rows/pass@2" in flat
    out = tmp_path / "run" / "eval" / "step_3"
    samples = [json.loads(line) for line in (out / "lookup.jsonl").read_text().splitlines()]
    assert len(samples) == 4 and {s["prompt_index"] for s in samples} == {0, 1}
    assert all(s["task"]["id"].startswith("eval-") and 0.0 <= s["value"] <= 1.0 and s["response"] for s in samples)
    samples = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert [(s["task"]["secret"], s["value"], s["drop_reason"]) for s in samples] == [
        ("moon", 1.0, None), ("moon", 1.0, None), ("nope", None, "env_error"), ("nope", None, "env_error")]
    assert [d["name"] for d in read_summary(tmp_path / "run", 3)["datasets"]] == ["lookup", "rows"]

