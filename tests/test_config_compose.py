"""Composition, schema checks and every validation rule, with the exact messages users see."""

from __future__ import annotations

import dataclasses

import pytest

from slimecli.config.io import dump_yaml, load_frozen, save_frozen
from slimecli.config.paths import group_members
from slimecli.config.recipes import available
from slimecli.config.schema import GROUPS
from slimecli.launch.source_checks import load
from tests.helpers import ROOT
from tests.helpers.config_errors import errors_of

# What a shipped recipe needs from the user before it can run (documented in the recipe's first line).
RECIPE_NEEDS = {"opd": ["teacher.url=http://127.0.0.1:7999"]}
MEMBER_NEEDS = {
    ("teacher", "server"): ["teacher.url=http://127.0.0.1:7999"],
    ("teacher", "sglang"): ["teacher.url=http://127.0.0.1:30000"],
    ("reward", "python"): ["reward.path=slimecli.reward:__name__"],
    ("task", "jsonl"): [f"task.path={ROOT / 'pyproject.toml'}"],
    ("reward", "env"): ["env=native", "env.id=lookup"],  # the environment's reward: only with an environment
    ("env", "native"): ["env.id=lookup"],
    ("env", "skyrl_gym"): ["env.id=gsm8k", "task=jsonl"],  # and task.path: rows written by the test
    ("env", "reasoning_gym"): ["env.id=chain_sum"],
    ("env", "mix"): ["env.mix=[{name: a, env: native, id: lookup}]"],
}


def test_primary_config_is_the_quickstart():
    cfg = load([])
    assert cfg.recipe == "quickstart"
    assert (cfg.model.name, cfg.rollout.name, cfg.trainer.name, cfg.agent.name) == ("tiny", "local", "torch", "none")


@pytest.mark.parametrize("recipe", sorted(available()))
def test_every_shipped_recipe_validates(recipe):
    cfg = load([f"+recipe={recipe}", *RECIPE_NEEDS.get(recipe, [])])
    assert cfg.recipe == recipe


# Members that pre-flight can only load with an installed package of theirs: their own tests install one.
NEEDS_A_PACKAGE = {("env", "verifiers"): "tests/test_env_verifiers.py", ("env", "openenv"): "tests/test_env_openenv.py"}


@pytest.mark.parametrize("group,member", [(g, m) for g in GROUPS for m in group_members(g)
                                          if (g, m) not in NEEDS_A_PACKAGE])
def test_every_group_member_validates(group, member, tmp_path):
    extra = list(MEMBER_NEEDS.get((group, member), []))
    if (group, member) == ("env", "skyrl_gym"):
        rows = tmp_path / "rows.jsonl"
        rows.write_text('{"prompt": [{"role": "user", "content": "1+1?"}], "reward_spec": {"ground_truth": "2"}}\n')
        extra.append(f"task.path={rows}")
    if group == "model" and member != "tiny":
        (tmp_path / "config.json").write_text("{}")
        extra.append(f"model.path={tmp_path}")
    if (group, member) == ("reward", "python"):
        fn = tmp_path / "r.py"
        fn.write_text("def score(sample):\n    return 1.0\n")
        extra = [f"reward.path={fn}:score"]
    cfg = load([f"{group}={member}", *extra])
    assert getattr(cfg, group).name == member if hasattr(getattr(cfg, group), "name") else True


def test_recipe_then_cli_precedence():
    cfg = load(["+recipe=swe_agent", "agent=codex", "optimizer=stateless_adam", "optimizer.lr=2e-6"])
    assert (cfg.agent.name, cfg.optimizer.name, cfg.optimizer.lr) == ("codex", "stateless_adam", 2e-6)
    assert cfg.rollout.max_new_tokens == 1024  # from the recipe
    assert cfg.optimizer.save_state is False  # from the stateless_adam member


def test_swe_agent_env_sits_between_recipe_and_command_line(monkeypatch):
    monkeypatch.setenv("SWE_AGENT", "codex")
    assert load(["+recipe=swe_agent"]).agent.name == "codex"
    assert load(["+recipe=swe_agent", "agent=claude_code"]).agent.name == "claude_code"
    assert load([]).agent.name == "none"  # a run without an agent stays without one


def test_swe_agent_env_is_validated(monkeypatch):
    monkeypatch.setenv("SWE_AGENT", "cluade_code")
    (msg,) = errors_of(["+recipe=swe_agent"])
    assert "$SWE_AGENT: unknown agent in environment variable (got 'cluade_code')" in msg
    assert "did you mean 'claude_code'?" in msg and "allowed: claude_code, codex" in msg


def test_unknown_key_names_full_path_with_did_you_mean():
    (msg,) = errors_of(["optimizer.lrr=1e-6"])
    assert msg == "optimizer.lrr: unknown key (got 1e-06)\n    hint: did you mean 'optimizer.lr'?"


def test_unknown_top_level_and_nested_paths():
    msgs = errors_of(["trainer.max_stpes=3", "rollot.temperature=1.0"])
    assert "trainer.max_stpes: unknown key (got 3)\n    hint: did you mean 'trainer.max_steps'?" in msgs
    assert any(m.startswith("rollot.temperature: unknown key") and "did you mean 'rollout.temperature'?" in m for m in msgs)


def test_slurm_nodes_is_another_name_for_nnodes(tmp_path):
    assert load(["cluster=slurm", "cluster.nodes=4"]).cluster.nnodes == 4
    assert load(["cluster.nodes=2", "cluster.nnodes=2", f"run.dir={tmp_path}"]).cluster.nnodes == 2
    (msg,) = errors_of(["cluster.nodes=2", "cluster.nnodes=4", f"run.dir={tmp_path}"])
    assert msg == ("cluster.nodes: is another name for cluster.nnodes, which is set to 4 on the same command line "
                   "(got 2)\n    hint: set only cluster.nnodes")
    recipe = tmp_path / "two_nodes.yaml"
    recipe.write_text("cluster:\n  name: slurm\n  nodes: 2\n")
    assert load([f"+recipe={recipe}"]).cluster.nnodes == 2
    assert load([f"+recipe={recipe}", "cluster.nnodes=4"]).cluster.nnodes == 4  # the command line wins
    assert load([f"+recipe={recipe}", "cluster.nodes=4"]).cluster.nnodes == 4


def test_wrong_type_names_path_value_and_expected_type():
    msgs = errors_of(["trainer.max_steps=abc", "optimizer.betas=[0.9]", "trainer.use_tis=3"])
    assert "trainer.max_steps: expected int (got 'abc')" in msgs
    assert "optimizer.betas: expected 2 items (tuple[float, float]) (got [0.9])" in msgs
    assert "trainer.use_tis: expected bool (true/false) (got 3)" in msgs


def test_literal_choices_listed():
    (msg,) = errors_of(["trainer.advantage_estimator=grpp"])
    assert msg.startswith("trainer.advantage_estimator: not an allowed value (got 'grpp')")
    assert "did you mean 'grpo'?" in msg and "reinforce_plus_plus_baseline" in msg


def test_unknown_group_member_lists_members():
    (msg,) = errors_of(["optimizer=adamw"])
    assert msg == ("optimizer: unknown optimizer option (got 'adamw')\n"
                   "    hint: did you mean 'adam'? allowed: adam, stateless_adam")


def test_unknown_recipe():
    (msg,) = errors_of(["+recipe=swe_agnet"])
    assert "recipe: unknown recipe (got 'swe_agnet')" in msg and "did you mean 'swe_agent'?" in msg


def test_all_errors_reported_at_once():
    msgs = errors_of(["optimizer.lrr=1", "agent=codx", "rollout.temperature=0", "trainer.max_steps=x"])
    assert len(msgs) == 4


def test_stateless_adam_rules():
    msgs = errors_of(["optimizer=stateless_adam", "optimizer.amsgrad=true", "optimizer.save_state=true"])
    assert any(m.startswith("optimizer.amsgrad: stateless_adam keeps no moments") for m in msgs)
    assert any(m.startswith("optimizer.save_state: stateless_adam has no optimizer state to save") for m in msgs)


@pytest.mark.parametrize("override,expected", [
    ("teacher.port=0", "teacher.port: must be a TCP port in 1..65535, or auto (got 0)"),
    ("teacher.warmup_timeout_s=0", "teacher.warmup_timeout_s: must be > 0 (got 0.0)"),
    ("teacher.update_timeout_s=-1", "teacher.update_timeout_s: must be > 0 (got -1.0)"),
    ("teacher.sample_chunk_size=0", "teacher.sample_chunk_size: must be > 0 (got 0)"),
    ("teacher.label_chunk_size=-4", "teacher.label_chunk_size: must be > 0 (got -4)"),
    ("teacher.max_length=-1", "teacher.max_length: must be >= 0 (0 = no limit) (got -1)"),
])
def test_teacher_limits(override, expected):
    assert expected in errors_of(["teacher=server", "teacher.url=http://127.0.0.1:7999", override])


def test_teacher_server_needs_a_source():
    (msg,) = errors_of(["teacher=server"])
    assert msg.startswith("teacher.model_path: teacher=server needs teacher.model_path")


def test_rollout_temperature_positive():
    assert "rollout.temperature: must be > 0 (log-probs are taken at this temperature) (got 0.0)" in errors_of(
        ["rollout.temperature=0"])


def test_eps_clip_high_at_least_eps_clip():
    assert "trainer.eps_clip_high: must be >= trainer.eps_clip (0.2) (got 0.1)" in errors_of(["trainer.eps_clip_high=0.1"])


def test_kl_coef_and_kl_loss_coef_exclusive():
    msgs = errors_of(["trainer.kl_coef=0.1", "trainer.kl_loss_coef=0.1", "trainer.advantage_estimator=reinforce_plus_plus"])
    assert msgs == ["trainer.kl_loss_coef: cannot be non-zero together with trainer.kl_coef (0.1) (got 0.1)\n"
                    "    hint: use either KL reward shaping (kl_coef) or the KL loss (kl_loss_coef)"]


def test_batch_divisibility():
    (msg,) = errors_of(["rollout.batch_size=3", "rollout.n_samples_per_prompt=3", "trainer.global_batch_size=4"])
    assert msg.startswith("trainer.global_batch_size: must divide rollout.batch_size x rollout.n_samples_per_prompt = 9")


def test_distillation_needs_teacher():
    (msg,) = errors_of(["trainer.opd_kl_coef=0.5"])
    assert msg.startswith("teacher: distillation needs a teacher (got 'none')")
    assert any(m.startswith("teacher: distillation needs a teacher") for m in errors_of(["+recipe=opd", "teacher=none"]))


def test_parallel_sizes_consistent():
    assert any("the torch trainer is data-parallel only" in m for m in errors_of(["trainer.tensor_parallel_size=2"]))
    msgs = errors_of(["trainer=megatron", "trainer.nproc=3", "trainer.tensor_parallel_size=2",
                      "trainer.global_batch_size=6", "rollout.batch_size=3"])
    assert any(m.startswith("trainer.nproc: world size 3 is not divisible by tensor x pipeline parallel = 2") for m in msgs)


def test_sequence_parallel_needs_megatron_tensor_parallelism():
    want = "trainer.sequence_parallel: sequence parallelism splits what tensor parallelism replicates"
    for overrides in (["trainer.sequence_parallel=true"], ["trainer=megatron", "trainer.sequence_parallel=true"]):
        assert any(m.startswith(want) for m in errors_of(overrides)), overrides
    ok = ["trainer=megatron", "trainer.nproc=2", "trainer.tensor_parallel_size=2", "trainer.sequence_parallel=true"]
    assert load(ok).trainer.sequence_parallel is True


def test_a_token_budget_is_refused_with_pipeline_stages_and_taken_elsewhere():
    budget = "trainer.max_tokens_per_micro_batch=4096"
    want = "trainer.max_tokens_per_micro_batch: pipeline stages exchange activations of one shape"
    piped = errors_of(["trainer=megatron", "trainer.nproc=2", "trainer.pipeline_parallel_size=2", budget])
    assert any(m.startswith(want) for m in piped), piped
    assert load([budget]).trainer.max_tokens_per_micro_batch == 4096
    assert load(["trainer=megatron", "trainer.nproc=2", "trainer.tensor_parallel_size=2", budget]
                ).trainer.max_tokens_per_micro_batch == 4096
    assert any(m.startswith("trainer.max_tokens_per_micro_batch: must be > 0")
               for m in errors_of(["trainer.max_tokens_per_micro_batch=0"]))


def test_model_path_must_be_hf_checkpoint(tmp_path):
    assert f"model.path: directory does not exist (got '{tmp_path}/nope')" in errors_of([f"model.path={tmp_path}/nope"])
    assert f"model.path: not a Hugging Face checkpoint (no config.json) (got '{tmp_path}')" in errors_of(
        [f"model.path={tmp_path}"])
    (tmp_path / "config.json").write_text("{}")
    assert load([f"model.path={tmp_path}"]).model.path == str(tmp_path)


def test_frozen_round_trip(tmp_path):
    cfg = load(["+recipe=swe_agent", "optimizer.betas=[0.8,0.9]"])
    path = save_frozen(cfg, tmp_path / "config.yaml")
    again = load_frozen(path)
    assert again == cfg and dump_yaml(again) == dump_yaml(cfg)
    with pytest.raises(dataclasses.FrozenInstanceError):
        again.optimizer.lr = 1.0  # frozen


def test_user_recipe_by_path_and_by_dir(tmp_path):
    (tmp_path / "mine.yaml").write_text("# @package _global_\n# mine\ndefaults:\n  - override /optimizer: stateless_adam\n"
                                        "optimizer:\n  lr: 3.0e-6\n")
    assert load([f"+recipe={tmp_path / 'mine.yaml'}"]).optimizer.lr == 3e-6
    cfg = load(["+recipe=mine"], recipe_dirs=(str(tmp_path),))
    assert (cfg.recipe, cfg.optimizer.name) == ("mine", "stateless_adam")


def test_jsonl_task_needs_an_existing_file(tmp_path):
    assert "task.path: task=jsonl needs task.path (a JSONL file of prompts) (got None)" in errors_of(["task=jsonl"])
    assert f"task.path: file does not exist (got '{tmp_path}/x.jsonl')" in errors_of(["task=jsonl", f"task.path={tmp_path}/x.jsonl"])


def test_kl_shaping_and_tis_combinations():
    (msg,) = errors_of(["trainer.kl_coef=0.1"])
    assert msg.startswith("trainer.kl_coef: KL reward shaping is not part of grpo's advantages")
    assert load(["trainer.kl_coef=0.1", "trainer.advantage_estimator=reinforce_plus_plus"]).trainer.kl_coef == 0.1
    (msg,) = errors_of(["trainer.use_tis=true", "trainer.use_rollout_logprobs=true"])
    assert msg.startswith("trainer.use_tis: an off-policy correction weighs recomputed old log-probs")
