"""env=skyrl_gym: SkyRL-Gym environments, written and registered the way SkyRL's users do (a BaseTextEnv subclass in
an installed package that calls skyrl_gym's register), and its built-in ones, driven from SkyRL-format dataset rows."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from slimecli.config.groups.env import EnvConfig
from slimecli.env.adapters import skyrl_gym as adapter
from slimecli.env.provider import EnvLoadError, EnvNotFound
from tests.helpers.episodes import play
from tests.helpers.packages import install_package, write_package

# The multi-turn example of SkyRL's "Creating a New Environment" tutorial, as a user's package would hold it.
MULTIPLY_ENV = '''
import re
from typing import Any, Dict

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput


class MultiplyEnv(BaseTextEnv):
    """Asks for a product in \\\\boxed{}; several attempts, feedback after a wrong one."""

    def __init__(self, env_config: Any = None, extras: Dict[str, Any] = {}):
        super().__init__()
        assert "reward_spec" in extras, "reward_spec field is required"
        assert "ground_truth" in extras["reward_spec"], "ground_truth is required in reward_spec field"
        self.ground_truth = extras["reward_spec"]["ground_truth"]
        self.max_turns = extras["max_turns"] if "max_turns" in extras else 5
        self.hint = env_config.hint
        self.extra_info = extras.get("extra_info", {})

    def _parse_action(self, action: str):
        match = re.search(r"\\\\boxed\\{([^}]+)\\}", action)
        return match.group(1) if match else None

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        answer = self._parse_action(action)
        is_correct = answer is not None and answer.strip() == str(self.ground_truth).strip()
        done = self.turns >= self.max_turns or is_correct
        reward = 1.0 if is_correct else 0.5 if answer is not None else 0.0
        if done:
            return BaseTextEnvStepOutput(observations=[], reward=reward, done=True, metadata={"parsed_answer": answer})
        feedback = f"Your answer '{answer}' is incorrect. {self.hint}" if answer is not None else (
            "Please provide your answer in the format \\\\boxed{your_answer}.")
        return BaseTextEnvStepOutput(observations=[{"role": "user", "content": feedback}], reward=0.0, done=False,
                                     metadata={"parsed_answer": answer})

    def get_metrics(self) -> Dict[str, Any]:
        return {"turns": self.turns, "digits": self.extra_info.get("num_digits")}


class NotAnEnv:
    pass
'''

REGISTER = '''
from skyrl_gym.envs import register

register(id="multiply_test", entry_point="skyrl_multiply_test.env:MultiplyEnv")
'''

SYSTEM = {"role": "system", "content": "Put the product in \\boxed{}."}


def row(question: str, answer: str, env_class: str | None = "multiply_test", **more: Any) -> dict[str, Any]:
    """A row as SkyRL's dataset scripts write them."""
    out: dict[str, Any] = {"data_source": "synthetic_multiply", "prompt": [SYSTEM, {"role": "user", "content": question}],
                           "reward_spec": {"method": "rule", "ground_truth": answer},
                           "extra_info": {"num_digits": 1, "split": "train"}, **more}
    if env_class is not None:
        out["env_class"] = env_class
    return out


@pytest.fixture(scope="module")
def multiply_pkg(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("skyrl_pkg")
    project = write_package(root / "src", "skyrl_multiply_test", {
        "skyrl_multiply_test/__init__.py": REGISTER,
        "skyrl_multiply_test/env.py": MULTIPLY_ENV,
    })
    install_package(project, root / "site")
    return "skyrl_multiply_test"


def cfg(max_turns: int = 3) -> EnvConfig:
    return EnvConfig(name="skyrl_gym", max_turns=max_turns)


def test_registered_multi_turn_env_from_installed_package(multiply_pkg: str) -> None:
    provider = adapter.load("multiply_test", {"module": multiply_pkg, "env_config": {"hint": "Try again."}}, cfg(3))
    assert provider.tasks("train") is None  # rows come from the user's dataset
    assert "skyrl_multiply_test.env:MultiplyEnv" in provider.describe()
    obs, results = asyncio.run(play(provider, row("3 * 4", "12"), ["I think 11", "\\boxed{11}", "\\boxed{12}"]))
    assert obs.messages == [SYSTEM, {"role": "user", "content": "3 * 4"}] and obs.tools is None
    unformatted, wrong, right = results
    assert (unformatted.reward, unformatted.done) == (0.0, False)
    assert unformatted.observation.messages == [
        {"role": "user", "content": "Please provide your answer in the format \\boxed{your_answer}."}]
    assert wrong.observation.messages == [{"role": "user", "content": "Your answer '11' is incorrect. Try again."}]
    assert (wrong.reward, wrong.done) == (0.0, False)
    assert (right.reward, right.done) == (1.0, True) and right.observation.messages == []
    assert right.info["metadata"] == {"parsed_answer": "12"}
    assert right.info["env_metrics"] == {"turns": 3, "digits": 1}
    assert ("multiply_test", "skyrl_multiply_test.env:MultiplyEnv") in adapter.available()


def test_env_max_turns_comes_from_the_run_config(multiply_pkg: str) -> None:
    """SkyRL's generator puts its max_turns into extras: the environment ends the episode there."""
    provider = adapter.load("multiply_test", {"module": multiply_pkg, "env_config": {"hint": "no"}}, cfg(2))
    _, results = asyncio.run(play(provider, row("2 * 2", "4"), ["\\boxed{5}", "\\boxed{6}"]))
    assert [(r.reward, r.done) for r in results] == [(0.0, False), (0.5, True)]


def test_import_path_to_the_class(multiply_pkg: str) -> None:
    provider = adapter.load(f"{multiply_pkg}.env:MultiplyEnv", {"env_config": {"hint": "h"}}, cfg(1))
    _, results = asyncio.run(play(provider, row("5 * 5", "25", env_class=None), ["\\boxed{25}"]))
    assert (results[0].reward, results[0].done) == (1.0, True)
    # gym's `module:id` form: importing the module registers the id
    provider = adapter.load(f"{multiply_pkg}:multiply_test", {"env_config": {"hint": "h"}}, cfg(1))
    _, results = asyncio.run(play(provider, row("5 * 5", "25"), ["\\boxed{24}"]))
    assert (results[0].reward, results[0].done) == (0.5, True)


def test_builtin_gsm8k_reward() -> None:
    provider = adapter.load("gsm8k", {}, cfg())
    task = {"data_source": "openai/gsm8k", "prompt": "Tom has 2 apples and buys 3. How many? End with #### N.",
            "env_class": "gsm8k", "reward_spec": {"method": "rule", "ground_truth": "5"}, "extra_info": {"index": 0}}
    obs, (good,) = asyncio.run(play(provider, task, ["2 + 3 = 5\n#### 5"]))
    assert obs.messages == [{"role": "user", "content": task["prompt"]}]
    assert (good.reward, good.done) == (1.0, True) and isinstance(good.reward, float)
    _, (bad,) = asyncio.run(play(provider, task, ["#### 6"]))
    assert (bad.reward, bad.done) == (0.0, True)


def test_row_env_class_routes_to_that_env() -> None:
    """SkyRL's per-sample env_class: a gsm8k source's row may name gsm8k_multi_turn (turn-level rewards)."""
    provider = adapter.load("gsm8k", {}, cfg(4))
    task = {"prompt": [{"role": "user", "content": "1+1?"}], "env_class": "gsm8k_multi_turn",
            "reward_spec": {"method": "rule", "ground_truth": "2"}}
    _, (wrong, right) = asyncio.run(play(provider, task, ["#### 3", "#### 2"]))
    assert wrong.reward == pytest.approx(0.2 / 4) and not wrong.done
    assert wrong.observation.messages[0]["role"] == "user" and "####" in wrong.observation.messages[0]["content"]
    assert (right.reward, right.done) == (1.0, True) and right.info["env_metrics"] == {"steps": 2}


def test_unknown_id_lists_the_registered_ones() -> None:
    with pytest.raises(EnvNotFound) as err:
        adapter.load("gsm8kk", {}, cfg())
    assert "gsm8k" in err.value.known and "gsm8k_multi_turn" in err.value.known
    assert "env.args.module" in str(err.value)
    with pytest.raises(EnvNotFound, match="no module 'no_such_pkg.env'"):
        adapter.load("no_such_pkg.env:Env", {}, cfg())


def test_bad_args(multiply_pkg: str) -> None:
    with pytest.raises(EnvLoadError, match=r"env.args.env_cfg \(did you mean 'env_config'\?\)"):
        adapter.load("gsm8k", {"env_cfg": {}}, cfg())
    with pytest.raises(EnvLoadError, match="no module 'not_installed_pkg'"):
        adapter.load("gsm8k", {"module": "not_installed_pkg"}, cfg())
    with pytest.raises(EnvLoadError, match="env_config must be a mapping"):
        adapter.load("gsm8k", {"env_config": "x"}, cfg())
    with pytest.raises(EnvLoadError, match="not a skyrl_gym Env"):
        adapter.load(f"{multiply_pkg}.env:NotAnEnv", {}, cfg())


def test_bad_rows_say_what_is_wrong() -> None:
    provider = adapter.load("gsm8k", {}, cfg())
    with pytest.raises(ValueError, match=r"no 'prompt'.*'question'"):
        asyncio.run(play(provider, {"question": "1+1", "reward_spec": {"ground_truth": "2"}}, []))
    with pytest.raises(ValueError, match="'gsm8k' rejected the row.*reward_spec field is required"):
        asyncio.run(play(provider, {"prompt": "1+1?", "answer": "2"}, []))
    with pytest.raises(ValueError, match="env_class 'nope' is not registered.*gsm8k"):
        asyncio.run(play(provider, {"prompt": "1+1?", "env_class": "nope"}, []))
    with pytest.raises(ValueError, match="each message needs a 'role'"):
        asyncio.run(play(provider, {"prompt": [{"content": "hi"}], "reward_spec": {"ground_truth": "2"}}, []))


def test_missing_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "skyrl_gym", None)
    assert adapter.available() == []
    with pytest.raises(EnvLoadError, match=r"pip install 'slimecli\[skyrl-gym\]'"):
        adapter.load("gsm8k", {}, cfg())


def test_adapter_import_does_not_import_the_library() -> None:
    code = "import sys, slimecli.env.adapters.skyrl_gym; assert 'skyrl_gym' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])
