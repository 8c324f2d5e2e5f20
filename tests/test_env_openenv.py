"""env=openenv: OpenEnv environments written as their users write them (an Environment subclass, its Action and
Observation models, a FastAPI app from create_app, an installed `openenv-<name>` package with openenv.yaml), served
by the adapter as a local uvicorn process and driven over OpenEnv's /ws sessions."""

from __future__ import annotations

import asyncio
import os
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from slimecli.config.groups.env import EnvConfig
from slimecli.env.adapters import openenv as adapter
from slimecli.env.protocol import Action, ToolCall
from slimecli.env.provider import EnvLoadError, EnvNotFound, EnvProvider
from tests.helpers.episodes import play, say
from tests.helpers.packages import install_package, write_package

pytest.importorskip("openenv")

CFG = EnvConfig(timeout_s=30.0)
Provider = adapter.OpenEnvProvider

GREET = {
    "greet_env/__init__.py": '"""Greet environment: the agent must greet the guest by name."""\n',
    "greet_env/openenv.yaml": "spec_version: 1\nname: greet_env\ntype: space\nruntime: fastapi\napp: server.app:app\n"
                              "port: 8000\n",
    "greet_env/models.py": """
        from openenv.core.env_server.types import Action, Observation
        from pydantic import Field


        class GreetAction(Action):
            message: str = Field(..., description="What the agent says")


        class GreetObservation(Observation):
            prompt: str = Field(default="", description="What the environment says")
            turns: int = Field(default=0, description="Turns taken so far")


        class FormAction(Action):
            name: str
            age: int
        """,
    "greet_env/server/__init__.py": "",
    "greet_env/server/greet_environment.py": """
        from typing import Any, Optional
        from uuid import uuid4

        from openenv.core.env_server.interfaces import Environment
        from openenv.core.env_server.types import State

        from ..models import GreetAction, GreetObservation


        class GreetEnvironment(Environment):
            SUPPORTS_CONCURRENT_SESSIONS = True

            def __init__(self):
                self._state = State(episode_id=str(uuid4()), step_count=0)
                self._guest = "world"

            def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None,
                      **kwargs: Any) -> GreetObservation:
                self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
                self._guest = kwargs.get("guest", "world")
                return GreetObservation(prompt=f"Greet {self._guest}.", done=False, reward=None)

            def step(self, action: GreetAction, timeout_s=None, **kwargs: Any) -> GreetObservation:
                self._state.step_count += 1
                greeted = f"hello {self._guest}".lower() in action.message.lower()
                return GreetObservation(prompt="Thanks!" if greeted else f"No: greet {self._guest}.",
                                        turns=self._state.step_count, done=greeted or self._state.step_count >= 3,
                                        reward=1.0 if greeted else None)

            @property
            def state(self) -> State:
                return self._state
        """,
    "greet_env/server/app.py": """
        import os

        from openenv.core.env_server.http_server import create_app

        from ..models import FormAction, GreetAction, GreetObservation
        from .greet_environment import GreetEnvironment

        app = create_app(GreetEnvironment, GreetAction, GreetObservation, env_name="greet_env",
                         max_concurrent_envs=int(os.getenv("MAX_CONCURRENT_ENVS", "4")))
        form_app = create_app(GreetEnvironment, FormAction, GreetObservation, env_name="greet_env")
        """,
}

CALC = {
    "calc_env/__init__.py": '"""Calc environment: MCP tools to add and to submit the answer."""\n',
    "calc_env/server/__init__.py": "",
    "calc_env/server/calc_environment.py": """
        from typing import Any, Optional

        from fastmcp import FastMCP
        from openenv.core.env_server.mcp_environment import MCPEnvironment
        from openenv.core.env_server.mcp_types import CallToolAction
        from openenv.core.env_server.types import Observation, State


        class CalcEnvironment(MCPEnvironment):
            def __init__(self):
                mcp = FastMCP("calc")
                self._state = State(step_count=0)
                self._submitted = None

                @mcp.tool
                def add(a: int, b: int) -> int:
                    \"\"\"Add two integers.\"\"\"
                    return a + b

                @mcp.tool
                def submit(answer: int) -> str:
                    \"\"\"Submit the final answer.\"\"\"
                    self._submitted = answer
                    return "submitted"

                super().__init__(mcp)

            def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None,
                      **kwargs: Any) -> Observation:
                self._state = State(episode_id=episode_id, step_count=0)
                self._submitted = None
                return Observation(done=False, reward=0.0, metadata={"status": "ready"})

            def _step_impl(self, action, timeout_s=None, **kwargs: Any) -> Observation:
                return Observation(done=False, reward=0.0, metadata={"error": "call a tool"})

            async def step_async(self, action, timeout_s=None, **kwargs: Any) -> Observation:
                self._state.step_count += 1
                obs = await super().step_async(action, timeout_s=timeout_s, **kwargs)
                if isinstance(action, CallToolAction) and action.tool_name == "submit":
                    obs.reward = 1.0 if self._submitted == 5 else 0.0
                    obs.done = True
                return obs

            @property
            def state(self) -> State:
                return self._state
        """,
    "calc_env/server/app.py": """
        from openenv.core.env_server.http_server import create_app
        from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

        from .calc_environment import CalcEnvironment

        app = create_app(CalcEnvironment, CallToolAction, CallToolObservation, env_name="calc_env")
        """,
}


def _started(provider: EnvProvider) -> Provider:
    assert isinstance(provider, Provider)
    return provider


def _calls(*calls: tuple[str, dict]) -> Action:
    return Action(text="<tool_call>...</tool_call>",
                  tool_calls=tuple(ToolCall(f"call-{i}", name, args) for i, (name, args) in enumerate(calls)))


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("openenv")
    target = root / "site"
    old_path = os.environ.get("PYTHONPATH")
    for name, files in (("openenv-greet_env", GREET), ("openenv-calc_env", CALC)):
        install_package(write_package(root / "src", name, {k: textwrap.dedent(v) for k, v in files.items()}), target)
    yield target
    if old_path is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old_path


@pytest.fixture(scope="module")
def servers(packages: Path) -> Iterator[tuple[Provider, Provider]]:
    """The two environments by name, as their users name them, started side by side."""
    with ThreadPoolExecutor(2) as pool:
        greet = pool.submit(adapter.load, "greet", {"system_prompt": "Be brief."}, CFG)
        calc = pool.submit(adapter.load, "calc_env", {}, CFG)
        providers = (_started(greet.result()), _started(calc.result()))
    yield providers
    for provider in providers:
        asyncio.run(provider.aclose())


def test_available_lists_installed_packages(packages: Path) -> None:
    listed = dict(adapter.available())
    assert "package openenv-greet_env 0.1.0" == listed["greet_env"]
    assert "calc_env" in listed


def test_text_env_reset_step_reward_done(servers: tuple[Provider, Provider]) -> None:
    greet, _ = servers
    assert "greet_env.server.app:app" in greet.describe()

    row = {"guest": "Ada", "prompt": "Meet the guest."}  # row fields reach reset(**kwargs)
    hello = Action(text="<think>who?</think>Hello Ada!", content="Hello Ada!", reasoning="who?")
    obs, (wrong, right) = asyncio.run(play(greet, row, ["hi there", hello]))
    assert obs.tools is None
    assert obs.messages == [{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "Meet the guest.\n\nGreet Ada."}]
    assert (wrong.reward, wrong.done, wrong.observation.messages) == (
        0.0, False, [{"role": "user", "content": "No: greet Ada."}])  # None reward -> 0.0
    assert (right.reward, right.done, right.observation.messages) == (1.0, True, [{"role": "user", "content": "Thanks!"}])


def test_mcp_env_tools_and_calls(servers: tuple[Provider, Provider]) -> None:
    _, calc = servers

    def episode(answer: int) -> tuple:
        return asyncio.run(play(calc, {"prompt": "What is 2 + 3? Use the tools."}, [
            _calls(("add", {"a": 2, "b": 3}), ("add", {"a": "two"})), _calls(("submit", {"answer": answer}))]))

    obs, (first, last) = episode(5)
    assert obs.messages == [{"role": "user", "content": "What is 2 + 3? Use the tools."}]
    assert obs.tools is not None
    tools = {t["function"]["name"]: t["function"] for t in obs.tools}
    assert set(tools) == {"add", "submit"}
    assert tools["add"]["description"] == "Add two integers."
    assert tools["add"]["parameters"]["properties"] == {"a": {"type": "integer"}, "b": {"type": "integer"}}
    assert all(t["type"] == "function" for t in obs.tools)
    ok, bad = first.observation.messages
    assert ok == {"role": "tool", "tool_call_id": "call-0", "name": "add", "content": "5"}
    assert bad["role"] == "tool" and bad["content"].startswith("Error (invalid_args)")
    assert (first.reward, first.done) == (0.0, False)
    assert (last.reward, last.done) == (1.0, True)
    assert last.observation.messages[0]["content"] == "submitted"
    _, (_, wrong) = episode(6)
    assert wrong.reward == 0.0
    _, [no_call] = asyncio.run(play(calc, {"prompt": "x"}, ["I will not use tools"]))
    assert (no_call.reward, no_call.done) == (0.0, True)  # a turn without a tool call ends the episode


def test_episodes_at_once(servers: tuple[Provider, Provider]) -> None:
    greet, calc = servers

    async def interleaved() -> list[float]:
        ada, bob = greet.episode(), greet.episode()
        await ada.reset({"guest": "Ada"})
        await bob.reset({"guest": "Bob"})  # both sessions open: each episode has its own environment
        rewards = [(await bob.step(say("hello Bob"))).reward, (await ada.step(say("hello Bob"))).reward,
                   (await ada.step(say("hello Ada"))).reward]
        await asyncio.gather(ada.close(), bob.close())
        return rewards

    assert asyncio.run(interleaved()) == [1.0, 0.0, 1.0]

    async def full(answer: int) -> float:
        _, [result] = await play(calc, {"prompt": "2 + 3?"}, [_calls(("submit", {"answer": answer}))])
        return result.reward

    async def three() -> list[float]:
        return await asyncio.gather(full(5), full(4), full(5))

    # the calc app holds one session (create_app's default max_concurrent_envs=1): the others wait for it
    assert asyncio.run(three()) == [1.0, 0.0, 1.0]


def test_url_connects_to_a_running_server(servers: tuple[Provider, Provider]) -> None:
    greet, _ = servers
    attached = adapter.load("greet", {"url": greet.base_url}, CFG)

    _, [result] = asyncio.run(play(attached, {"guest": "Cy"}, ["Hello Cy"]))
    assert result.reward == 1.0
    asyncio.run(attached.aclose())  # started nothing, stops nothing
    with urllib.request.urlopen(f"{greet.base_url}/health", timeout=5) as response:
        assert response.status == 200


def test_unknown_id(packages: Path) -> None:
    with pytest.raises(EnvNotFound) as err:
        adapter.load("gret", {}, CFG)
    assert {"greet_env", "calc_env"} <= set(err.value.known)
    with pytest.raises(EnvNotFound):
        adapter.load("greet_env.server.nothing:app", {}, CFG)


@pytest.mark.parametrize("args", [{"port": 8000}, {"workers": 0}, {"env_vars": ["A=1"]}], ids=lambda a: next(iter(a)))
def test_bad_args_are_named(packages: Path, args: dict) -> None:
    with pytest.raises(EnvLoadError, match=f"env.args.{next(iter(args))}"):
        adapter.load("greet", args, CFG)


def test_action_not_fillable_from_text_is_refused(packages: Path) -> None:
    with pytest.raises(EnvLoadError, match=r"FormAction .*it also requires age"):
        adapter.load("greet_env.server.app:form_app", {}, CFG)


def test_app_failing_to_start_names_the_error(packages: Path) -> None:
    with pytest.raises(EnvLoadError, match=r"(?s)greet_env:not_there exited with code .*Attribute \"not_there\""):
        adapter.load("greet_env:not_there", {}, CFG)


def test_server_gone_after_aclose(packages: Path) -> None:
    provider = _started(adapter.load("greet_env", {"env_vars": {"MAX_CONCURRENT_ENVS": 2}}, CFG))
    pid, url = provider.pid, provider.base_url
    assert pid is not None
    os.killpg(pid, 0)  # alive
    asyncio.run(provider.aclose())
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{url}/health", timeout=2)


def test_missing_library_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adapter.importlib.util, "find_spec", lambda name, *args: None)
    assert adapter.available() == []
    with pytest.raises(EnvLoadError, match=r"pip install 'slimecli\[openenv\]'"):
        adapter.load("greet", {}, CFG)
