"""The eval config: its schema, per-dataset overrides over the run's settings, and every rule's message."""

from __future__ import annotations

import textwrap

from slimecli.config.eval_settings import dataset_reward, dataset_sampling, dataset_task
from slimecli.launch.source_checks import load
from tests.helpers import invoke_cli
from tests.helpers.config_errors import errors_by_key


def recipe(tmp_path, body: str) -> str:
    path = tmp_path / "r.yaml"
    path.write_text("# @package _global_\n" + textwrap.dedent(body))
    return f"+recipe={path}"


def test_quickstart_evaluates_its_heldout_set_at_start_and_end():
    cfg = load([])
    assert cfg.eval.at_start and cfg.eval.at_end and cfg.eval.interval == 0
    (ds,) = cfg.eval.datasets
    assert (ds.name, ds.task, ds.n_samples_per_prompt) == ("heldout", "quickstart", 4)
    from slimecli.rollout.quickstart import TEMPLATES, WORDS, heldout_prompts

    prompts = heldout_prompts()
    assert len(prompts) == 16 and all(p["label"] == p["label"].upper() for p in prompts)
    trained = {t.format(x=w) for t in TEMPLATES for w in WORDS}
    assert not trained & {p["prompt"] for p in prompts}  # held out: never a training prompt


def test_dataset_overrides_fall_back_to_the_run(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "hi", "label": "HI"}\n')
    cfg = load([recipe(tmp_path, f"""
        rollout: {{temperature: 0.9, max_new_tokens: 16}}
        eval:
          interval: 5
          datasets:
            - {{name: a, path: {data}}}
            - name: b
              path: {data}
              temperature: 0.3
              top_k: 5
              stop: ["\\n"]
              apply_chat_template: false
              reward: {{name: exact_match, on_invalid: error}}
            - {{name: swe, task: swe, path: "builtin:swe_tiny", max_samples: 2}}
        """), "agent=codex"])
    a, b, swe = cfg.eval.datasets
    ra, rb = dataset_sampling(a, cfg.rollout), dataset_sampling(b, cfg.rollout)
    assert (ra.temperature, ra.max_new_tokens, ra.top_k) == (0.9, 16, -1)
    assert (rb.temperature, rb.max_new_tokens, rb.top_k) == (0.3, 16, 5) and b.stop == ("\n",)
    assert dataset_reward(a, cfg.reward) == cfg.reward  # the run's reward (quickstart)
    assert dataset_reward(b, cfg.reward).name == "exact_match" and dataset_reward(b, cfg.reward).on_invalid == "error"
    # SWE tasks are graded by their tests: the swe_tests member, with its own defaults (key: resolved)
    assert (dataset_reward(swe, cfg.reward).name, dataset_reward(swe, cfg.reward).key) == ("swe_tests", "resolved")
    assert dataset_task(b, cfg.task).apply_chat_template is False and dataset_task(a, cfg.task).shuffle is False


def test_unknown_key_in_a_dataset_is_named_with_a_hint(tmp_path):
    errs = errors_by_key(recipe(tmp_path, """
        eval:
          datasets:
            - {name: a, task: quickstart}
            - {name: b, task: quickstart, tempratur: 0.5, reward: {nme: math}}
        """))
    assert "did you mean 'eval.datasets[1].temperature'?" in errs["eval.datasets[1].tempratur"]
    assert "did you mean 'eval.datasets[1].reward.name'?" in errs["eval.datasets[1].reward.nme"]


def test_bad_values_are_config_errors(tmp_path):
    errs = errors_by_key(recipe(tmp_path, """
        eval:
          interval: -2
          datasets:
            - {name: a, task: quickstart, n_samples_per_prompt: 0, temperature: 0, top_p: 1.5, max_samples: 0}
            - {name: a, task: quickstart, reward: {name: exact_matc}}
            - {name: "bad name", task: jsonl, path: /nonexistent/x.jsonl}
            - {name: c, task: quickstart, reward: {name: python}}
            - {name: d, task: swe, path: "builtin:swe_tiny"}
        """))
    assert "must be >= 0" in errs["eval.interval"]
    assert "must be >= 1" in errs["eval.datasets[0].n_samples_per_prompt"]
    assert "eval.datasets[0].temperature" in errs and "eval.datasets[0].top_p" in errs
    assert "eval.datasets[0].max_samples" in errs
    assert "did you mean 'exact_match'?" in errs["eval.datasets[1].reward.name"]
    assert "two datasets have this name" in errs["eval.datasets[1].name"]
    assert "eval.datasets[2].name" in errs and "file does not exist" in errs["eval.datasets[2].path"]
    assert "needs reward.path" in errs["eval.datasets[3].reward.path"]
    assert "agent=claude_code" in errs["eval.datasets[4].task"]


def test_eval_on_without_datasets(tmp_path):
    errs = errors_by_key(recipe(tmp_path, "eval: {interval: 2, at_start: false, at_end: false, datasets: []}\n"))
    assert "nothing to evaluate" in errs["eval.datasets"]


def test_config_validate_exits_2_with_every_eval_error(tmp_path):
    out = invoke_cli("config", "validate", recipe(tmp_path, """
        eval:
          interval: -1
          datasets:
            - {name: a, task: quickstart}
            - {name: b, task: quickstart, tempratur: 0.5, n_samples_per_prompt: 0, reward: {name: exact_matc}}
        """))
    assert out.returncode == 2, out.stdout + out.stderr
    for text in ("eval.datasets[1].tempratur: unknown key", "did you mean 'eval.datasets[1].temperature'?",
                 "eval.interval: must be >= 0", "eval.datasets[1].n_samples_per_prompt: must be >= 1",
                 "eval.datasets[1].reward.name: unknown reward", "did you mean 'exact_match'?"):
        assert text in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_config_show_has_the_eval_section():
    out = invoke_cli("config", "show")
    assert out.returncode == 0 and "eval:" in out.stdout and "name: heldout" in out.stdout


def test_eval_command_refuses_what_it_cannot_evaluate(tmp_path):
    out = invoke_cli("eval", f"run.dir={tmp_path / 'nothing'}")
    assert out.returncode == 2 and "run.dir: no run there (no config.yaml)" in out.stderr, out.stderr
    out = invoke_cli("eval", "eval.datasets=[]", "eval.at_start=false", "eval.at_end=false", f"run.root={tmp_path}")
    assert out.returncode == 2 and "eval.datasets: nothing to evaluate" in out.stderr, out.stderr
    out = invoke_cli("eval", "eval.datasets=[{name:x,task:quickstart,temprature:1}]", f"run.root={tmp_path}")
    assert out.returncode == 2 and "did you mean 'eval.datasets[0].temperature'?" in out.stderr, out.stderr
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(invoke_cli("config", "show").stdout)
    out = invoke_cli("eval", f"run.dir={run}", "optimizer=stateless_adam", "rollout.tempratur=1")
    assert out.returncode == 2, out.stderr
    assert "a finished run's config is evaluated as it was frozen" in out.stderr
    assert "did you mean 'rollout.temperature'?" in out.stderr and "the run has no final model" in out.stderr
    assert not list(tmp_path.glob("eval-*"))  # nothing was started
