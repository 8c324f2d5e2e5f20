"""trainer.off_policy_correction: importance weights between the engine's sampling policy and the trainer's."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from slimecli.config.compose import load
from slimecli.config.errors import ConfigErrors
from slimecli.config.groups.trainer import TrainerConfig
from slimecli.rollout.sample import Sample, token_versions, version_number
from slimecli.train import off_policy as op
from slimecli.train import stages
from slimecli.train.registry import get_off_policy_correction

CFG = TrainerConfig(tis_clip_low=0.5, tis_clip_high=2.0, is_mask_low=0.5, is_mask_high=2.0)
# two sequences of three tokens; the last token of the second is padding
OLD = torch.tensor([[0.0, 1.0, -1.0], [0.2, 0.1, 0.0]])
ENGINE = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 5.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
E = math.e


def test_tis_truncates_the_ratio():
    c = op.tis(OLD, ENGINE, MASK, CFG)
    assert c.weights[0].tolist() == pytest.approx([1.0, 2.0, 0.5])  # e -> 2, 1/e -> 0.5
    assert c.weights[1, :2].tolist() == pytest.approx([math.exp(0.2), math.exp(0.1)])
    assert c.clipped.tolist() == [[False, True, True], [False, False, False]]  # padding never counts
    assert not c.masked.any()


def test_mis_masks_whole_sequences_by_their_geometric_mean_ratio():
    wide = dataclasses.replace(CFG, is_mask_low=0.9, is_mask_high=1.1)
    c = op.mis(OLD, ENGINE, MASK, wide)
    # row 0: mean log-ratio 0 -> ratio 1, kept with its token ratios; row 1: mean 0.15 -> 1.16 > 1.1, masked
    assert c.weights[0].tolist() == pytest.approx([1.0, E, 1 / E])
    assert c.weights[1, :2].tolist() == [0.0, 0.0]
    assert c.masked.tolist() == [[False, False, False], [True, True, False]]


def test_icepop_masks_tokens_outside_the_bounds():
    c = op.icepop(OLD, ENGINE, MASK, CFG)
    assert c.weights[0].tolist() == pytest.approx([1.0, 0.0, 0.0])  # e > 2 and 1/e < 0.5 are masked
    assert c.weights[1, :2].tolist() == pytest.approx([math.exp(0.2), math.exp(0.1)])
    assert c.masked.tolist() == [[False, True, True], [False, False, False]]


def test_decoupled_ppo_masks_only_weights_above_the_cap():
    c = op.decoupled_ppo(OLD, ENGINE, MASK, CFG)
    assert c.weights[0].tolist() == pytest.approx([1.0, 0.0, 1 / E])  # a small weight stays (AReaL's cap)
    assert c.masked.tolist() == [[False, True, False], [False, False, False]]


def test_mismatch_kl_is_zero_on_policy_and_positive_off_it():
    assert op.mismatch_kl(ENGINE, ENGINE, MASK).item() == pytest.approx(0.0)
    kl = op.mismatch_kl(OLD, ENGINE, MASK).item()
    terms = [E - 2, 1 / E, math.exp(0.2) - 1.2, math.exp(0.1) - 1.1, 0.0]  # k3 = r - 1 - log r per token
    assert kl == pytest.approx(sum(terms) / 5)


def sample(lp: list[float], versions: list[int] | None, mask: list[int] | None = None) -> Sample:
    return Sample(tokens=[1] * (len(lp) + 1), response_length=len(lp), rollout_log_probs=lp, loss_mask=mask,
                  token_versions=versions)


def test_the_stage_weighs_each_token_by_the_log_prob_of_the_version_that_sampled_it():
    # a partial rollout: the first two tokens sampled by version 3, the last two by version 4 after a push
    s = sample([-1.0, -1.0, -0.5, -0.5], [3, 3, 4, 4])
    batch = stages.StepBatch([s, sample([-0.2], [4])], [1.0, 0.0], {})
    old = [torch.tensor([-1.0, -1.2, -0.5, -0.4]), torch.tensor([-0.2])]  # the trainer's weights of version 4
    weights, m = stages.off_policy(batch, old, dataclasses.replace(CFG, off_policy_correction="tis"), version=4)
    assert weights is not None
    expected = [math.exp(o - e) for o, e in zip([-1.0, -1.2, -0.5, -0.4], [-1.0, -1.0, -0.5, -0.5], strict=True)]
    assert weights[0].tolist() == pytest.approx(expected)
    assert m["off_policy/old_token_share"] == pytest.approx(2 / 5)  # two of five trained tokens from version 3
    assert m["off_policy/clipped_frac"] == 0.0 and m["off_policy/masked_frac"] == 0.0
    assert m["off_policy/mismatch_kl"] > 0
    # without a correction: no weights, the metrics still
    weights, m = stages.off_policy(batch, old, CFG, version=4)
    assert weights is None and m["off_policy/old_token_share"] == pytest.approx(2 / 5)
    # a masked token is not trained, so it is not counted
    masked = sample([-1.0, -0.5], [3, 4], mask=[0, 1])
    _, m = stages.off_policy(stages.StepBatch([masked], [0.0], {}), None, CFG, version=4)
    assert m == {"off_policy/old_token_share": 0.0}


def test_a_correction_without_engine_log_probs_is_an_error():
    s = Sample(tokens=[1, 2, 3], response_length=2, rollout_log_probs=None)
    with pytest.raises(ValueError, match="off_policy_correction=icepop"):
        stages.off_policy(stages.StepBatch([s], [0.0], {}), [torch.zeros(2)],
                          dataclasses.replace(CFG, off_policy_correction="icepop"), version=1)


def test_versions_of_the_engine_replies():
    assert [version_number(v) for v in ("default", "7", "policy-v3", "", None, "x")] == [0, 7, 3, -1, -1, -1]
    spans = {"weight_version": "5", "weight_versions": [{"version": "4", "start": 0, "end": 2},
                                                        {"version": "5", "start": 2, "end": 3}]}
    assert token_versions(spans, 3) == [4, 4, 5]
    assert token_versions({"weight_version": "default"}, 2) == [0, 0]
    s = Sample(tokens=[9])
    s.append_response([1, 2], [-0.1, -0.2], versions=[2, 3])
    s.append_response([3], None, trainable=False)  # tool output: no version of its own
    assert s.token_versions == [2, 3, -1]


def test_use_tis_is_the_deprecated_spelling_of_tis_and_names_are_checked():
    assert load(["trainer.use_tis=true"]).trainer.off_policy_correction == "tis"
    assert get_off_policy_correction("icepop").fn is op.icepop
    assert load(["trainer.off_policy_correction=decoupled_ppo"]).trainer.off_policy_correction == "decoupled_ppo"
    with pytest.raises(ConfigErrors) as exc:
        load(["trainer.off_policy_correction=icepp", "trainer.is_mask_low=3", "trainer.use_tis=true"])
    text = str(exc.value)
    assert "trainer.off_policy_correction" in text and "did you mean 'icepop'" in text
    assert "trainer.use_tis: is the deprecated spelling" in text
    with pytest.raises(ConfigErrors, match="trainer.is_mask_high: must be > trainer.is_mask_low"):
        load(["trainer.off_policy_correction=mis", "trainer.is_mask_low=3"])
