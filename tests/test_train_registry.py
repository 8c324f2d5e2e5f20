"""Advantage-estimator and policy-loss registries: built-ins, scoped overrides, import paths, config rule, gspo alias."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import pytest
import torch

from slimecli.config.compose import load
from slimecli.config.errors import ConfigErrors
from slimecli.config.groups.trainer import TrainerConfig
from slimecli.config.registry import UnknownPluginError
from slimecli.launch.source_checks import load as preflight_load
from slimecli.rollout.sample import Sample
from slimecli.train import advantages as A
from slimecli.train import losses as L
from slimecli.train.registry import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    get_advantage_estimator,
    get_policy_loss,
    register_advantage_estimator,
)
from tests.helpers import ROOT
from tests.helpers.config_errors import errors_of


def cfg(**kw) -> TrainerConfig:
    return dataclasses.replace(TrainerConfig(), **kw)


def samples() -> list[Sample]:
    return [Sample(group_index=g, tokens=[5] * (2 + n), response_length=n) for g, n in [(0, 2), (0, 1), (1, 1), (1, 2)]]


def test_builtins_are_registered():
    assert ADVANTAGE_ESTIMATORS.names()[:3] == ["grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"]
    assert get_advantage_estimator("grpo").fn is A.grpo
    assert get_advantage_estimator("reinforce_plus_plus").options == {"whiten": True}
    assert get_advantage_estimator("grpo").options == {"whiten": False}
    assert get_policy_loss("ppo_clip").fn is L.ppo_clip


def test_unknown_names_get_a_did_you_mean():
    with pytest.raises(KeyError, match=r"trainer.advantage_estimator: unknown advantage estimator 'grpp'; "
                                       r"did you mean 'grpo'\?"):
        get_advantage_estimator("grpp")
    with pytest.raises(KeyError, match=r"did you mean 'ppo_clip'\?.*import path"):
        get_policy_loss("ppo_clp")


def test_override_is_scoped_and_restores_the_registry():
    before = ADVANTAGE_ESTIMATORS.names()
    original = get_advantage_estimator("grpo")

    def ones(batch: A.AdvantageBatch, c: TrainerConfig) -> torch.Tensor:
        return torch.ones_like(batch.mask)

    with ADVANTAGE_ESTIMATORS.override(all_ones=ones, grpo=ones):
        assert "all_ones" in ADVANTAGE_ESTIMATORS.names()
        out = A.compute_advantages(samples(), [1.0, 0.0, 0.0, 0.0], cfg(advantage_estimator="all_ones"), 2)
        assert [t.tolist() for t in out.advantages] == [[1.0, 1.0], [1.0], [1.0], [1.0, 1.0]]
        assert get_advantage_estimator("grpo").fn is ones
    assert ADVANTAGE_ESTIMATORS.names() == before
    assert get_advantage_estimator("grpo") == original
    with pytest.raises(KeyError):
        get_advantage_estimator("all_ones")


def test_decorator_registers_inside_an_override():
    with ADVANTAGE_ESTIMATORS.override():
        @register_advantage_estimator("rank_reward", whiten=True)
        def rank_reward(batch: A.AdvantageBatch, c: TrainerConfig) -> tuple[torch.Tensor, torch.Tensor]:
            adv = batch.rewards.float().unsqueeze(-1).expand_as(batch.mask).clone()
            return adv, adv

        out = A.compute_advantages(samples(), [1.0, 0.0, 0.0, 0.0], cfg(advantage_estimator="rank_reward"), 2)
        # whitened over the 6 tokens 1, 1, 0, 0, 0, 0: mean 1/3, population var 2/9
        s = math.sqrt(2 / 9 + 1e-8)
        assert out.advantages[0].tolist() == pytest.approx([(2 / 3) / s] * 2)
        assert out.advantages[1].tolist() == pytest.approx([(-1 / 3) / s])
    assert "rank_reward" not in ADVANTAGE_ESTIMATORS.names()


def test_names_must_not_look_like_import_paths():
    with pytest.raises(ValueError, match="without ':'"):
        register_advantage_estimator("my.module:fn")


def test_estimator_by_import_path(tmp_path):
    path = tmp_path / "my_estimators.py"
    path.write_text("def raw(batch, cfg):\n    return batch.rewards.float().unsqueeze(-1) * batch.mask\n")
    out = A.compute_advantages(samples(), [1.0, 0.0, 0.5, 2.0], cfg(advantage_estimator=f"{path}:raw"), 2)
    assert [t.tolist() for t in out.advantages] == [[1.0, 1.0], [0.0], [0.5], [2.0, 2.0]]
    by_module = A.compute_advantages(samples(), [1.0, 0.0, 0.5, 2.0],
                                     cfg(advantage_estimator="slimecli.train.advantages:grpo"), 2)
    grpo = A.compute_advantages(samples(), [1.0, 0.0, 0.5, 2.0], cfg(), 2)
    assert [t.tolist() for t in by_module.advantages] == [t.tolist() for t in grpo.advantages]
    with pytest.raises(ValueError, match="trainer.advantage_estimator=.*cannot load"):
        get_advantage_estimator(f"{path}:missing")


def test_estimator_output_shape_is_checked():
    with ADVANTAGE_ESTIMATORS.override(flat=lambda batch, c: batch.rewards):
        with pytest.raises(ValueError, match=r"'flat' returned advantages of shape \(4,\), expected \(4, 2\)"):
            A.estimate(samples(), [1.0, 0.0, 0.0, 0.0], cfg(advantage_estimator="flat"), 2)


def test_custom_policy_loss_gets_the_ratio_and_its_metrics_are_reduced():
    def vanilla(log_ratio: torch.Tensor, adv: torch.Tensor, c: TrainerConfig):
        ratio = log_ratio.exp()
        return -ratio * adv, {"ratio_mean": ratio}

    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = logp.detach() - torch.tensor([[0.0, math.log(1.5)]])  # ratios 1, 1.5
    weights = torch.tensor([[0.5, 0.5]])
    with POLICY_LOSSES.override(vanilla=vanilla):
        loss, metrics = L.policy_loss(logp, old, torch.ones(1, 2), weights, cfg(policy_loss="vanilla"))
    assert loss.item() == pytest.approx(-1.25)  # unclipped: 0.5 * (-1 - 1.5)
    assert metrics["ratio_mean"].item() == pytest.approx(1.25)
    assert "pg_clipfrac" not in metrics  # the clip metrics belong to ppo_clip
    with POLICY_LOSSES.override(bad=lambda r, a, c: (r.sum(), {})):
        with pytest.raises(ValueError, match="per-token shape"):
            L.policy_loss(logp, old, torch.ones(1, 2), weights, cfg(policy_loss="bad"))


def test_gspo_alias_is_grpo_with_a_sequence_ratio():
    old = load(["trainer.advantage_estimator=gspo"]).trainer  # rewritten where the config is composed
    assert (old.advantage_estimator, old.importance_level) == ("grpo", "sequence")
    with pytest.raises(UnknownPluginError, match="unknown advantage estimator 'gspo'"):
        get_advantage_estimator("gspo")  # the trainer's registry never meets the old spelling
    rewards = [1.0, 0.0, 0.5, 0.5]
    gspo = A.compute_advantages(samples(), rewards, old, 2)
    grpo = A.compute_advantages(samples(), rewards, cfg(), 2)
    assert [t.tolist() for t in gspo.advantages] == [t.tolist() for t in grpo.advantages]
    logp = torch.tensor([[0.1, 0.3, 0.0]])
    weights = torch.tensor([[0.5, 0.5, 0.0]])
    old_spelling, _ = L.policy_loss(logp, torch.zeros(1, 3), -torch.ones(1, 3), weights, old)
    new_spelling, _ = L.policy_loss(logp, torch.zeros(1, 3), -torch.ones(1, 3), weights, cfg(importance_level="sequence"))
    assert old_spelling.item() == new_spelling.item() == pytest.approx(math.exp(0.2), abs=1e-6)
    token, _ = L.policy_loss(logp, torch.zeros(1, 3), -torch.ones(1, 3), weights, cfg())
    assert token.item() != pytest.approx(new_spelling.item())


# ---- the config rule ----------------------------------------------------------------------------------------
def test_config_accepts_registered_names_aliases_and_import_paths():
    assert load(["trainer.advantage_estimator=gspo"]).trainer.advantage_estimator == "grpo"
    assert load(["trainer.importance_level=sequence"]).trainer.importance_level == "sequence"
    spec = "slimecli.train.advantages:reinforce_plus_plus"
    assert load([f"trainer.advantage_estimator={spec}"]).trainer.advantage_estimator == spec
    assert load(["trainer.policy_loss=slimecli.train.losses:ppo_clip"]).trainer.policy_loss.endswith(":ppo_clip")


def test_a_name_registered_at_run_time_validates_until_its_override_ends():
    with ADVANTAGE_ESTIMATORS.override():
        @register_advantage_estimator("ranked")
        def ranked(batch: A.AdvantageBatch, c: TrainerConfig) -> torch.Tensor:
            return torch.zeros_like(batch.mask, dtype=torch.float32)

        assert load(["trainer.advantage_estimator=ranked"]).trainer.advantage_estimator == "ranked"
    (msg,) = errors_of(["trainer.advantage_estimator=ranked"])
    assert msg.startswith("trainer.advantage_estimator: not an allowed value (got 'ranked')")


def test_config_rejects_unknown_names_with_a_did_you_mean():
    (msg,) = errors_of(["trainer.advantage_estimator=reinforce_plus"])
    assert msg.startswith("trainer.advantage_estimator: not an allowed value (got 'reinforce_plus')")
    assert "did you mean 'reinforce_plus_plus'?" in msg and "import path package.module:function" in msg
    assert "gspo" not in msg  # deprecated: accepted, not advertised
    (msg,) = errors_of(["trainer.policy_loss=ppo_clp"])
    assert msg.startswith("trainer.policy_loss: not an allowed value (got 'ppo_clp')") and "'ppo_clip'" in msg
    (msg,) = errors_of(["trainer.policy_loss=losses.py"])  # the text alone: the config rule
    assert msg.startswith("trainer.policy_loss: not an allowed value (got 'losses.py')")
    (msg,) = errors_of(["trainer.policy_loss=losses.py:"])
    assert msg.startswith("trainer.policy_loss: cannot find the policy loss: 'losses.py:' has no ':function' part")
    # whether the function is there: pre-flight, which every command reads its config through
    spec = "slimecli.train.advantages:nope"
    assert load([f"trainer.advantage_estimator={spec}"]).trainer.advantage_estimator == spec
    with pytest.raises(ConfigErrors) as info:
        preflight_load([f"trainer.advantage_estimator={spec}", "trainer.policy_loss=/no/such/loss.py:f"])
    estimator, loss = (e.render() for e in info.value.errors)
    assert estimator.startswith("trainer.advantage_estimator: cannot find the advantage estimator: module "
                                "slimecli.train.advantages defines no 'nope'; it defines: ")
    assert loss == "trainer.policy_loss: cannot find the policy loss: file /no/such/loss.py does not exist " \
                   "(got '/no/such/loss.py:f')"
    (msg,) = errors_of(["trainer.importance_level=seq"])
    assert msg.startswith("trainer.importance_level: not an allowed value (got 'seq')")


def test_config_validation_does_not_import_torch():
    code = ("import sys; from slimecli.config.compose import load; load(['trainer.advantage_estimator=grpo']); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
