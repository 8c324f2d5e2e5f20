"""env=native: environments found by built-in name, by an installed package's entry point (group
slimecli.environments: `pip install my-env` is enough) and by import path, all through the one plugin registry; and
the config rules of an environment run (what it implies, what it refuses, the did-you-mean of a bad id)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from slimecli.config.compose import load
from slimecli.config.errors import ConfigErrors
from slimecli.config.groups.env import EnvConfig
from slimecli.config.registry import ENVIRONMENTS
from slimecli.env.adapters import native
from slimecli.env.protocol import Action, ToolCall
from slimecli.env.provider import EnvLoadError, EnvNotFound
from tests.helpers import invoke_cli
from tests.helpers.packages import install_package, write_package

COUNTER = '''
from slimecli.env.protocol import Observation, StepResult


class Counter:
    """Say the next number: a user's environment, shipped as a package."""

    def __init__(self, start=1):
        self.start = start

    def tasks(self, split="train"):
        return [{"n": self.start + i} for i in range(4)]

    async def reset(self, task):
        self.n = task["n"]
        return Observation([{"role": "user", "content": f"What comes after {self.n}?"}])

    async def step(self, action):
        return StepResult(reward=float(action.content.strip() == str(self.n + 1)), done=True)

    async def close(self):
        pass
'''


@pytest.fixture(scope="module")
def counter_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pkgs")
    project = write_package(root, "counter_env", {"counter_env/__init__.py": COUNTER},
                            entry_points={"slimecli.environments": {"counter": "counter_env:Counter"}})
    return install_package(project, root / "site")


def test_an_installed_package_registers_its_environment_by_entry_point(counter_package: Path) -> None:
    with ENVIRONMENTS.scoped():
        assert "counter" in ENVIRONMENTS.names() and ENVIRONMENTS.origin("counter") == "counter_env 0.1.0"
        assert ENVIRONMENTS.origin("lookup") == "slimecli"
        provider = native.load("counter", {"start": 10}, EnvConfig())
        assert provider.tasks() == [{"n": 10}, {"n": 11}, {"n": 12}, {"n": 13}]
        env = provider.episode()
        obs = asyncio.run(env.reset({"n": 10}))
        assert obs.messages[0]["content"] == "What comes after 10?"
        assert asyncio.run(env.step(Action(text="11", content="11"))).reward == 1.0
        assert ("counter", "counter_env 0.1.0") in native.available()


def test_import_paths_bad_arguments_and_unknown_names(counter_package: Path) -> None:
    assert native.load("counter_env:Counter", {}, EnvConfig()).describe() == "native:counter_env:Counter (import path)"
    with pytest.raises(EnvLoadError, match=r"env.args: counter_env:Counter does not take \['stop'\]"):
        native.load("counter_env:Counter", {"stop": 3}, EnvConfig())
    with pytest.raises(EnvNotFound) as info:
        native.load("lokup", {}, EnvConfig())
    assert "lookup" in info.value.known
    with pytest.raises(EnvLoadError, match="cannot load"):
        native.load("counter_env:Nope", {}, EnvConfig())


def test_the_lookup_environment_rewards_only_a_looked_up_answer() -> None:
    provider = native.load("lookup", {"num_tasks": 3}, EnvConfig())
    assert len(provider.tasks("train")) == 3 and provider.tasks("train") != provider.tasks("eval")
    env = provider.episode()
    obs = asyncio.run(env.reset({"secret": "moon"}))
    assert [t["function"]["name"] for t in obs.tools or []] == ["lookup", "answer"]
    guess = asyncio.run(env.step(Action(text="", tool_calls=(ToolCall("c0", "answer", {"word": "moon"}),))))
    assert guess.done and guess.reward == 0.0  # right, but a guess
    env = provider.episode()
    asyncio.run(env.reset({"secret": "moon"}))
    looked = asyncio.run(env.step(Action(text="", tool_calls=(ToolCall("c0", "lookup", {}),))))
    assert set(looked.observation.messages[0]["content"].split("\n")) == {"moon"} and not looked.done
    assert [t["function"]["name"] for t in looked.observation.tools or []] == ["answer"]
    done = asyncio.run(env.step(Action(text="", tool_calls=(ToolCall("c1", "answer", {"word": "moon"}),))))
    assert done.done and done.reward == 1.0


def errors(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigErrors) as info:
        load(overrides)
    return [e.render() for e in info.value.errors]


def test_an_environment_implies_its_rollout_and_reward_and_refuses_others() -> None:
    cfg = load(["env=native", "env.id=lookup", "env.args.num_tasks=8"])
    assert (cfg.rollout.generate, cfg.reward.name, cfg.env.args) == ("env", "env", {"num_tasks": 8})
    assert load([]).rollout.generate == "single_turn" and load([]).reward.name == "quickstart"
    assert any("cannot be given with env=native" in e for e in errors(["env=native", "env.id=lookup", "reward=f1"]))
    assert any("rollout.generate" in e for e in errors(["env=native", "env.id=lookup", "rollout.generate=agent"]))
    assert any("needs the environment to load" in e for e in errors(["env=native"]))
    assert any("did you mean 'lookup'" in e for e in errors(["env=native", "env.id=lokup"]))
    assert any("reward=env is the reward" in e for e in errors(["reward=env"]))
    mix = errors(["env=mix", "env.mix=[{name: a, env: native, id: lookup}, {name: a, env: native, id: lookup}]"])
    assert any("env.mix[1].name" in e for e in mix)


def test_validate_names_an_environment_that_does_not_load(counter_package: Path) -> None:
    out = invoke_cli("config", "validate", "env=reasoning_gym", "env.id=chain_sun")
    assert out.returncode == 2 and "did you mean 'chain_sum'" in out.stderr and "Traceback" not in out.stderr
    out = invoke_cli("config", "validate", "env=native", "env.id=counter", "env.args.stop=1")
    assert out.returncode == 2 and "does not take ['stop']" in out.stderr
    assert invoke_cli("config", "validate", "env=native", "env.id=counter").returncode == 0
