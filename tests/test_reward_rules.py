"""The reward group's validation rules, with the messages users see, through the real composer and the pre-flight
every command reads its config through (whether reward.path's function is there is a pre-flight check)."""

from __future__ import annotations

import subprocess
import sys

from slimecli.config import compose
from slimecli.launch.source_checks import load
from tests.helpers import invoke_cli
from tests.helpers.config_errors import errors_of


def test_every_reward_member_composes(tmp_path):
    reward_file = tmp_path / "my_reward.py"
    reward_file.write_text("def score(sample):\n    return 1.0\n")
    assert load(["reward=math"]).reward.name == "math"
    assert load(["reward=f1"]).reward.name == "f1"
    assert load(["reward=exact_match"]).reward.name == "exact_match"
    assert load(["reward=remote"]).reward.url.startswith("http://")
    assert load(["reward=swe_tests"]).reward.name == "swe_tests"
    cfg = load(["reward=python", f"reward.path={reward_file}:score", "reward.group=true", "reward.key=score"])
    assert (cfg.reward.path, cfg.reward.group, cfg.reward.key) == (f"{reward_file}:score", True, "score")
    assert load(["reward=python", "reward.path=slimecli.reward.math_answer:math_reward"]).reward.path


def test_python_reward_needs_a_resolvable_function(tmp_path):
    (tmp_path / "r.py").write_text("import os\n\ndef score(sample):\n    return 1.0\n\nasync def other(s):\n    pass\n")
    (tmp_path / "broken.py").write_text("def score(sample)\n    return 1\n")
    assert errors_of(["reward=python"]) == [
        "reward.path: reward=python needs reward.path (got None)\n"
        "    hint: use package.module:function or /path/to/file.py:function"]
    [msg] = errors_of(["reward=python", f"reward.path={tmp_path}/nope.py:score"])
    assert f"cannot find the reward function: file {tmp_path}/nope.py does not exist" in msg
    [msg] = errors_of(["reward=python", f"reward.path={tmp_path}/r.py:scor"])
    assert f"file {tmp_path}/r.py defines no 'scor'; it defines: other, score" in msg
    [msg] = errors_of(["reward=python", f"reward.path={tmp_path}/broken.py:score"])
    assert "has a syntax error (line 1)" in msg
    [msg] = errors_of(["reward=python", "reward.path=no_such_pkg_xyz.rewards:score"])
    assert "module no_such_pkg_xyz.rewards not found on the Python path" in msg
    [msg] = errors_of(["reward=python", "reward.path=slimecli.reward.math_answer:no_fn"])
    assert "module slimecli.reward.math_answer defines no 'no_fn'" in msg and "math_reward" in msg
    [msg] = errors_of(["reward=python", "reward.path=just_a_module"])
    assert "has no ':function' part" in msg
    [msg] = errors_of(["reward=math", "reward.group=true"])
    assert msg.startswith("reward.group: reward.group=true applies to a python function")


def test_remote_reward_needs_a_url_and_sane_limits():
    [msg] = errors_of(["reward=remote", "reward.url=null"])
    assert msg.startswith("reward.url: reward=remote needs the URL of the reward server (got None)")
    msgs = errors_of(["reward=remote", "reward.url=ftp://host/x", "reward.timeout_s=0", "reward.concurrency=0",
                      "reward.max_retries=-1", "reward.backoff_s=-1"])
    assert sorted(msgs) == sorted([  # the schema's field errors come before the rules' (all reported together)
        "reward.url: must be an http:// or https:// URL with a host (got 'ftp://host/x')",
        "reward.timeout_s: must be > 0 (got 0.0)",
        "reward.concurrency: must be > 0 (got 0)",
        "reward.max_retries: must be >= 0 (got -1)",
        "reward.backoff_s: must be >= 0 (got -1.0)",
    ])
    assert errors_of(["reward=remote", "reward.url=http://"]) == [
        "reward.url: must be an http:// or https:// URL with a host (got 'http://')"]


def test_unknown_reward_name_lists_names_and_suggests():
    [msg] = errors_of(["reward.name=mathh"])
    assert msg == ("reward.name: unknown reward (got 'mathh')\n    hint: did you mean 'math'? allowed: env, exact_match, "
                   "f1, judge, math, python, quickstart, remote, swe_tests")  # no test leaves a registration behind
    [msg] = errors_of(["reward.on_invalid=skip"])
    assert msg.startswith("reward.on_invalid:")


def test_validating_a_python_reward_imports_nothing(tmp_path):
    """The rule locates the module without running it: a reward module that imports torch stays unimported."""
    pkg = tmp_path / "heavy_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('package imported during validation')\n")
    (pkg / "rewards.py").write_text("import torch\n\ndef score(sample):\n    return 1.0\n")
    code = ("import sys; "
            "from slimecli.launch.source_checks import load; "
            "cfg = load(['reward=python', 'reward.path=heavy_pkg.rewards:score']); "
            "assert 'torch' not in sys.modules and 'heavy_pkg' not in sys.modules; print(cfg.reward.path)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "heavy_pkg.rewards:score"


def test_the_function_is_looked_for_in_pre_flight_not_by_the_config_layer(tmp_path):
    """The config layer reads no file: a missing reward function composes there, and pre-flight reports it (the
    run's under reward.path, an eval dataset's own under its key), all at once, exit 2 from `config validate`."""
    missing = f"{tmp_path}/nope.py:score"
    assert compose.load(["reward=python", f"reward.path={missing}"]).reward.path == missing
    recipe = tmp_path / "r.yaml"
    recipe.write_text("# @package _global_\neval:\n  datasets:\n    - {name: own, task: quickstart, reward: "
                      f"{{name: python, path: '{tmp_path}/other.py:f'}}}}\n    - {{name: run, task: quickstart}}\n")
    out = invoke_cli("config", "validate", "-r", str(tmp_path), "+recipe=r", "reward=python", f"reward.path={missing}")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert f"reward.path: cannot find the reward function: file {tmp_path}/nope.py does not exist" in out.stderr
    assert (f"eval.datasets[0].reward.path: cannot find the reward function: file {tmp_path}/other.py does not "
            "exist") in out.stderr
    assert "eval.datasets[1]" not in out.stderr  # the run's own reward: reported once
    assert out.stderr.count("hint: use package.module:function or /path/to/file.py:function") == 2


def test_judge_config_errors_name_their_field(tmp_path):
    """reward=judge: where the judge is, a rubric with the answer in it, and one verdict form that structured
    outputs can enforce."""
    assert load(["reward=judge"]).reward.judge_url == "embedded"
    assert load(["reward=judge", "reward.judge_url=http://127.0.0.1:30000", "reward.verdict=score"]).reward.verdict
    assert errors_of(["reward=judge", "reward.judge_url=null"]) == [
        "reward.judge_url: reward=judge needs the judge's URL (got None)\n    hint: an SGLang server "
        "(http://host:30000), an OpenAI-compatible base URL (https://host/v1), or embedded (the run starts one)"]
    [msg] = errors_of(["reward=judge", "reward.judge_url=ftp://x"])
    assert msg.startswith("reward.judge_url: must be an http:// or https:// URL with a host, or embedded")
    [msg] = errors_of(["reward=judge", "reward.judge_api=openai"])
    assert msg.startswith("reward.judge_api: the embedded judge serves SGLang's /generate, not the OpenAI API")
    [msg] = errors_of(["reward=judge", "reward.rubric='Grade {prompt}'"])
    assert msg.startswith("reward.rubric: must contain {response}")
    [msg] = errors_of(["reward=judge", "reward.verdict_regex='(PASS'"])
    assert msg.startswith("reward.verdict_regex: not a regular expression: missing ), unterminated subpattern")
    [msg] = errors_of(["reward=judge", "reward.verdict_regex='P?'"])
    assert msg.startswith("reward.verdict_regex: matches the empty text")
    [msg] = errors_of(["reward=judge", "reward.verdict_regex='(?=P)PASS'"])
    assert msg.startswith("reward.verdict_regex: not a constraint structured outputs compile:")
    assert "look-around" in msg and "reward.judge_grammar=false" in msg
    assert load(["reward=judge", "reward.verdict_regex='(?=P)PASS'", "reward.judge_grammar=false"]).reward.verdict_regex
    [msg] = errors_of(["reward=judge", "reward.verdict_regex=PASS", "reward.verdict_schema='{}'"])
    assert msg.startswith("reward.verdict_schema: give reward.verdict_regex or reward.verdict_schema, not both")
    [msg] = errors_of(["reward=judge", "reward.verdict_schema='{\"type\": \"object\"}'"])
    assert msg.startswith("reward.verdict_schema: must be an object schema with a 'verdict' property")
    [msg] = errors_of(["reward=judge", "reward.verdict_schema='{\"properties\": {\"verdict\": {}}}'"])
    assert msg.startswith("reward.verdict_schema: must list 'verdict' in \"required\"")
    [msg] = errors_of(["reward=judge", "reward.verdict_schema='{not json'"])
    assert msg.startswith("reward.verdict_schema: not JSON")
    [msg] = errors_of(["reward=judge", "cluster.nnodes=2", "cluster.node_hosts=[a,b]", f"run.dir={tmp_path}"])
    assert msg.startswith("reward.judge_port: a multi-node run's embedded judge needs a port every node agrees on")
