"""env=verifiers: tasksets written for the verifiers 0.4 library ("the v1 stack", `import verifiers.v1 as vf`) the way
its `vf-init` template and its docs lay them out (TaskData + Task with @vf.reward/@vf.metric/@vf.stop, a
TasksetConfig, a Taskset exporting itself via __all__, a vf.Toolset with @vf.tool), installed as a real package,
played by hand-built policy turns."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from slimecli.config.groups.env import EnvConfig
from slimecli.env.adapters import verifiers as adapter
from slimecli.env.protocol import Action, ToolCall
from slimecli.env.provider import EnvLoadError, EnvNotFound
from tests.helpers.episodes import play, say
from tests.helpers.packages import install_package, write_package

pytest.importorskip("verifiers.v1")

EXACT_TASKSET = '''
from typing import Literal

import verifiers.v1 as vf

TRAIN = [("What is 2 + 3?", "5"), ("What is 7 * 6?", "42")]
TEST = [("What is 10 - 4?", "6")]


class ExactData(vf.TaskData):
    """One row's data: the reference answer."""

    answer: str


class ExactTask(vf.Task[ExactData]):
    @vf.reward(weight=1.0)
    async def exact(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.answer)

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class ExactConfig(vf.TasksetConfig):
    split: Literal["train", "test"] = "test"
    num_tasks: int = 10
    """How many tasks to build."""


class ExactTaskset(vf.Taskset[ExactTask, ExactConfig]):
    def load(self) -> list[ExactTask]:
        rows = TRAIN if self.config.split == "train" else TEST
        return [ExactTask(ExactData(prompt=q, system_prompt="Answer with the number only.", answer=a),
                          self.config.task) for q, a in rows[: self.config.num_tasks]]
'''

CALC_TOOL = '''
import verifiers.v1 as vf


class CalcState(vf.State):
    runs: int = 0


class CalcToolset(vf.Toolset[vf.ToolsetConfig, CalcState]):
    TOOL_PREFIX = "calc"

    @vf.tool
    def python(self, code: str) -> str:
        """Run Python code and return what it prints."""
        self.state.runs += 1
        lines = []
        exec(code, {"print": lambda *args: lines.append(" ".join(map(str, args)))})
        return "\\n".join(lines)


if __name__ == "__main__":
    CalcToolset.run()
'''

CALC_TASKSET = '''
import verifiers.v1 as vf

from calc_tools_v1.servers.tool import CalcState, CalcToolset


class CalcData(vf.TaskData):
    answer: str


class CalcTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class CalcTask(vf.Task[CalcData, CalcState, CalcTaskConfig]):
    @classmethod
    def toolsets(cls, config: CalcTaskConfig) -> list[vf.Toolset]:
        return [CalcToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.answer)

    @vf.reward(weight=0.5)
    async def used_python(self, trace: vf.Trace) -> float:
        return float(bool(trace.tool_messages))

    @vf.metric
    async def python_runs(self, trace: vf.Trace) -> float:
        return float(trace.state.runs)

    @vf.stop
    async def too_many_runs(self, trace: vf.Trace) -> bool:
        return trace.state.runs >= 3


class CalcConfig(vf.TasksetConfig):
    task: CalcTaskConfig = CalcTaskConfig()


class CalcTaskset(vf.Taskset[CalcTask, CalcConfig]):
    def load(self) -> list[CalcTask]:
        prompt = "What is 17 * 23? Use the python tool, then answer with the number only."
        return [CalcTask(CalcData(prompt=prompt, answer="391"), self.config.task)]
'''

# an Env whose run() plays two seats, and a task whose reward runs things in the task's box
DUEL = '''
import verifiers.v1 as vf


class DuelTask(vf.Task):
    @vf.reward
    async def passed(self, trace: vf.Trace, runtime: vf.Runtime) -> float:
        result = await runtime.run(["pytest", "-q"], {})
        return float(result.exit_code == 0)


class DuelTaskset(vf.Taskset[DuelTask, vf.TasksetConfig]):
    def load(self) -> list[DuelTask]:
        return [DuelTask(vf.TaskData(prompt="Fix the bug."))]


class DuelConfig(vf.EnvConfig):
    solver: vf.AgentConfig = vf.AgentConfig()
    critic: vf.AgentConfig = vf.AgentConfig()


class DuelEnv(vf.Env[DuelConfig]):
    async def run(self, task, agents):
        await agents.solver.run(task)
        await agents.critic.run(task)
'''


@pytest.fixture(scope="module", autouse=True)
def packages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vf_src")
    project = write_package(root, "exact-answer-v1", {
        "exact_answer_v1/__init__.py": "from exact_answer_v1.taskset import ExactTaskset\n\n__all__ = ['ExactTaskset']\n",
        "exact_answer_v1/taskset.py": EXACT_TASKSET,
        "calc_tools_v1/__init__.py": "from calc_tools_v1.taskset import CalcTaskset\n\n__all__ = ['CalcTaskset']\n",
        "calc_tools_v1/taskset.py": CALC_TASKSET,
        "calc_tools_v1/servers/__init__.py": "",
        "calc_tools_v1/servers/tool.py": CALC_TOOL,
        "duel_v1/__init__.py": "from duel_v1.env import DuelEnv, DuelTaskset\n\n__all__ = ['DuelTaskset', 'DuelEnv']\n",
        "duel_v1/env.py": DUEL,
    }, dependencies=("verifiers",))
    return install_package(project, tmp_path_factory.mktemp("vf_site"))


def cfg(**kw: Any) -> EnvConfig:
    return EnvConfig(name="verifiers", **kw)


def run_python(code: str, call_id: str = "c1") -> Action:
    return Action(text="", tool_calls=(ToolCall(call_id, "calc_python", {"code": code}),))


def test_single_turn_exact_answer_by_installed_id() -> None:
    provider = adapter.load("exact-answer-v1", {}, cfg())
    train = provider.tasks("train")
    assert [r["answer"] for r in train] == ["5", "42"]
    assert [r["answer"] for r in provider.tasks("eval")] == ["6"]  # the taskset's `split` field: test
    obs, [right] = asyncio.run(play(provider, train[0], [say("5")]))
    assert obs.messages == [{"role": "system", "content": "Answer with the number only."},
                            {"role": "user", "content": "What is 2 + 3?"}]
    assert obs.tools is None
    assert right.done and right.reward == 1.0
    assert right.info["rewards"] == {"exact": 1.0} and right.info["metrics"] == {"reply_chars": 1.0}
    _, [wrong] = asyncio.run(play(provider, train[1], [say("41")]))
    assert wrong.done and wrong.reward == 0.0
    # a row of the user's own dataset becomes the taskset's task type
    _, [own] = asyncio.run(play(provider, {"prompt": "What is 1 + 1?", "answer": "2"}, [say("2")]))
    assert own.reward == 1.0
    assert "ExactTaskset" in provider.describe()
    # the hub form of the id (owner/name@version) names the same package
    assert adapter.load("someone/exact-answer-v1@0.1.0", {"split": "train"}, cfg()).tasks()[0]["answer"] == "5"


def test_multi_turn_tool_env_scores_right_and_wrong_rollouts() -> None:
    provider = adapter.load("calc_tools_v1.taskset:CalcTaskset", {}, cfg())
    [row] = provider.tasks()
    obs, results = asyncio.run(play(provider, row, [run_python("print(17 * 23)"), say("391")]))
    [schema] = obs.tools
    assert schema["function"]["name"] == "calc_python"
    assert schema["function"]["description"] == "Run Python code and return what it prints."
    assert "code" in schema["function"]["parameters"]["properties"]
    first, last = results
    assert not first.done and first.reward == 0.0
    assert first.observation.messages == [{"role": "tool", "tool_call_id": "c1", "content": "391",
                                           "name": "calc_python"}]
    assert last.done and last.reward == 1.5  # correct (1.0) + used_python (0.5 x 1.0)
    assert last.info["metrics"] == {"python_runs": 1.0}  # the toolset's state is the trace's

    _, results = asyncio.run(play(provider, row, [run_python("print(17 * 24)"), say("408")]))
    assert results[-1].done and results[-1].reward == 0.5

    # no tool call at all: the chat loop ends at once, nothing earned for the tool
    _, [direct] = asyncio.run(play(provider, row, [say("391")]))
    assert direct.done and direct.reward == 1.0

    # a failing tool answers with its error, the episode goes on; an unknown tool name is answered too
    calls = (ToolCall("c1", "calc_python", {"code": "print(1/0)"}), ToolCall("c2", "calc_nope", {}))
    _, [failed] = asyncio.run(play(provider, row, [Action(text="", tool_calls=calls)]))
    crashed, unknown = failed.observation.messages
    assert not failed.done and "division by zero" in crashed["content"]
    assert unknown == {"role": "tool", "tool_call_id": "c2", "content": "error: unknown tool 'calc_nope'",
                       "name": "calc_nope"}


def test_task_stop_and_turn_limit_end_the_episode_scored() -> None:
    provider = adapter.load("calc-tools-v1", {}, cfg())  # the same taskset by its id
    row = provider.tasks()[0]
    _, results = asyncio.run(play(provider, row, [run_python("print(1)", f"c{i}") for i in range(5)]))
    assert len(results) == 3 and results[-1].done  # the task's @vf.stop after three runs
    assert results[-1].info["stop"] == "too_many_runs" and results[-1].reward == 0.5
    limited = adapter.load("calc-tools-v1", {}, cfg(max_turns=2))
    _, results = asyncio.run(play(limited, row, [run_python("print(1)", f"c{i}") for i in range(5)]))
    assert len(results) == 2 and results[-1].done and results[-1].info["stop"] == "max_turns"


def test_unknown_ids_and_bad_arguments() -> None:
    with pytest.raises(EnvNotFound) as err:
        adapter.load("no-such-taskset-v1", {}, cfg())
    assert "exact-answer-v1" in err.value.known
    with pytest.raises(EnvNotFound):
        adapter.load("no_such_module.taskset:Taskset", {}, cfg())
    with pytest.raises(EnvNotFound):
        adapter.load("exact_answer_v1.taskset:Missing", {}, cfg())
    with pytest.raises(EnvLoadError, match=r"env\.args\.num_tasks"):
        adapter.load("exact-answer-v1", {"num_tasks": "many"}, cfg())
    with pytest.raises(EnvLoadError, match=r"env\.args\.nope"):
        adapter.load("exact-answer-v1", {"nope": 1}, cfg())
    with pytest.raises(EnvLoadError, match=r"env\.args\.split"):
        adapter.load("exact_answer_v1.taskset:ExactTaskset", {"split": "dev"}, cfg())
    assert ("exact-answer-v1", "installed package exact-answer-v1 0.1.0") in adapter.available()


def test_unsupported_kinds_are_refused_at_load() -> None:
    with pytest.raises(EnvLoadError, match="DuelEnv.*roles: solver, critic"):
        adapter.load("duel-v1", {}, cfg())
    with pytest.raises(EnvLoadError, match="DuelTask's @vf.reward 'passed' needs a runtime"):
        adapter.load("duel_v1.env:DuelTaskset", {}, cfg())
    provider = adapter.load("exact-answer-v1", {}, cfg())
    with pytest.raises(EnvLoadError, match="needs a container"):  # a row that runs in a container image
        asyncio.run(provider.episode().reset({"prompt": "Fix it.", "answer": "1", "image": "python:3.11"}))
