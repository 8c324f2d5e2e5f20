"""The launch plan places each engine on its own GPUs after the trainer's, gives engines their own SGLang flags,
and starts SGLang with llguidance when constrained agent turns send it llguidance grammars. Plan output only."""

from __future__ import annotations

from pathlib import Path

import pytest

from slimecli.config.compose import load
from slimecli.config.errors import ConfigErrors
from slimecli.launch.plan import build_plan, sglang_gpus
from slimecli.launch.spec import ProcessSpec
from slimecli.model.tiny import create_tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp("placement") / "m", seed=0)


def engines(model: Path, tmp_path: Path, *overrides: str) -> list[ProcessSpec]:
    cfg = load([f"model.path={model}", "rollout.port=30000", *overrides])
    return [s for s in build_plan(cfg, tmp_path) if s.name.startswith("engine-")]


def flag(spec: ProcessSpec, name: str) -> str | None:
    return spec.argv[spec.argv.index(name) + 1] if name in spec.argv else None


def test_sglang_engines_take_the_gpus_after_the_trainers(model: Path, tmp_path: Path) -> None:
    specs = engines(model, tmp_path, "rollout=sglang", "rollout.num_engines=3", "trainer.nproc=2",
                    "rollout.sglang_args=--tp-size 2")
    assert [flag(s, "--base-gpu-id") for s in specs] == ["2", "4", "6"]  # GPUs 0-1: trainer ranks 0 and 1
    specs = engines(model, tmp_path, "rollout=sglang", "rollout.num_engines=2", "trainer.nproc=1")
    assert [flag(s, "--base-gpu-id") for s in specs] == ["1", "2"]


def test_each_engine_gets_its_own_flags_and_a_base_gpu_given_by_hand_wins(model: Path, tmp_path: Path) -> None:
    specs = engines(model, tmp_path, "rollout=sglang", "rollout.num_engines=2", "trainer.nproc=1",
                    "rollout.sglang_args=--tp 2",
                    "rollout.sglang_engine_args=['--tp 4 --mem-fraction-static 0.6','--base-gpu-id=0']")
    first, second = specs
    assert first.argv[-4:] == ["--tp", "4", "--mem-fraction-static", "0.6"]  # after the shared flags: it wins
    assert flag(first, "--base-gpu-id") == "1" and flag(second, "--base-gpu-id") is None  # engine 0 takes 1-4
    assert second.argv[-1] == "--base-gpu-id=0" and "--mem-fraction-static" not in second.argv


def test_engine_flags_are_checked_before_launch(model: Path) -> None:
    with pytest.raises(ConfigErrors) as exc:
        load([f"model.path={model}", "rollout=sglang", "rollout.sglang_engine_args=['','','']"])
    assert "rollout.sglang_engine_args" in str(exc.value) and "3 entries for 1 engine" in str(exc.value)
    with pytest.raises(ConfigErrors, match="rollout=sglang"):
        load([f"model.path={model}", "rollout.sglang_engine_args=['--tp 2']"])
    with pytest.raises(ConfigErrors, match="rollout.sglang_args: cannot be split"):
        load([f"model.path={model}", "rollout=sglang", "rollout.sglang_args='--chat-template \"x'"])


def test_embedded_engines_get_a_gpu_of_their_own_only_where_the_node_has_one(model: Path, tmp_path: Path) -> None:
    placed = engines(model, tmp_path, "rollout.num_engines=2", "trainer.nproc=2", "cluster.gpus_per_node=4")
    assert [s.env.get("CUDA_VISIBLE_DEVICES") for s in placed] == ["2", "3"]
    for too_few in (["cluster.gpus_per_node=3"], ["cluster.gpus_per_node=0"],
                    ["cluster.gpus_per_node=4", "rollout.device=cuda:1"]):
        specs = engines(model, tmp_path, "rollout.num_engines=2", "trainer.nproc=2", *too_few)
        assert all("CUDA_VISIBLE_DEVICES" not in s.env for s in specs), too_few  # shared, as before


def test_constrained_agents_start_sglang_with_llguidance(model: Path, tmp_path: Path) -> None:
    agent = ["rollout=sglang", "+recipe=swe_agent"]
    (spec,) = engines(model, tmp_path, *agent, "agent.constrain=tool_calls")
    assert flag(spec, "--grammar-backend") == "llguidance"
    (spec,) = engines(model, tmp_path, *agent)
    assert "--grammar-backend" not in spec.argv  # nothing constrained: SGLang's default
    (spec,) = engines(model, tmp_path, *agent, "agent.constrain=tool_calls",
                      "rollout.sglang_args=--grammar-backend xgrammar")
    assert spec.argv.count("--grammar-backend") == 1 and flag(spec, "--grammar-backend") == "xgrammar"


@pytest.mark.parametrize("args, gpus", [([], 1), (["--tp-size", "4"], 4), (["--tp=2", "--dp-size", "2"], 4),
                                        (["--tp", "2", "--dp", "2", "--enable-dp-attention"], 2),
                                        (["--tp-size", "2", "--pp-size", "2"], 4)])
def test_gpus_of_one_sglang_server(args: list[str], gpus: int) -> None:
    assert sglang_gpus(args) == gpus
