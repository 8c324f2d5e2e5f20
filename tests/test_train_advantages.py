"""Advantage estimators against hand computations (numbers worked out in the comments)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from slimecli.config.groups.trainer import TrainerConfig
from slimecli.rollout.sample import Sample
from slimecli.train import advantages as A


def cfg(**kw) -> TrainerConfig:
    return dataclasses.replace(TrainerConfig(), **kw)


def sample(group: int, length: int, mask: list[int] | None = None, **kw) -> Sample:
    return Sample(group_index=group, tokens=[5] * (3 + length), response_length=length, loss_mask=mask, **kw)


def values(ts: list[torch.Tensor]) -> list[list[float]]:
    return [t.tolist() for t in ts]


def assert_close(got: list[list[float]], want: list[list[float]], tol: float = 1e-5) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w, abs=tol), (got, want)


def test_grpo_group_mean_and_unbiased_std_per_group():
    # groups interleaved in the batch: group 0 = rewards 1, 0, 0; group 1 = rewards 1, 1, 0
    samples = [sample(0, 2), sample(1, 1), sample(0, 3), sample(1, 2), sample(0, 1), sample(1, 1)]
    rewards = [1, 1, 0, 1, 0, 0]
    out = A.compute_advantages(samples, rewards, cfg(advantage_estimator="grpo"), n_samples_per_prompt=3)
    # group 0: mean 1/3 -> centred 2/3, -1/3, -1/3; unbiased var = (4/9 + 1/9 + 1/9) / 2 = 1/3
    s = math.sqrt(1 / 3) + 1e-6
    hi, lo = (2 / 3) / s, (-1 / 3) / s
    # group 1: mean 2/3 -> centred 1/3, 1/3, -2/3; same std
    want = [[hi] * 2, [(1 / 3) / s], [lo] * 3, [(1 / 3) / s] * 2, [lo], [(-2 / 3) / s]]
    assert_close(values(out.advantages), want)
    assert_close(values(out.returns), want)
    assert hi == pytest.approx(2 / math.sqrt(3), abs=1e-5)


def test_grpo_without_std_and_gspo_same_advantages():
    samples = [sample(0, 1), sample(0, 1), sample(1, 1), sample(1, 1)]
    rewards = [1.0, 0.0, 0.5, 0.5]
    plain = A.compute_advantages(samples, rewards, cfg(scale_by_std=False), 2)
    assert_close(values(plain.advantages), [[0.5], [-0.5], [0.0], [0.0]])  # group means 0.5 and 0.5
    grpo = A.compute_advantages(samples, rewards, cfg(advantage_estimator="grpo"), 2)
    gspo = A.compute_advantages(samples, rewards, cfg(importance_level="sequence"), 2)  # what gspo is read as
    # group 0: centred +-0.5, unbiased std of (1, 0) = sqrt(0.5)
    assert grpo.advantages[0].item() == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-6), abs=1e-6)
    assert grpo.advantages[2].item() == 0.0  # a group that agrees: 0 / (0 + 1e-6)
    assert values(grpo.advantages) == values(gspo.advantages)


def test_grpo_n1_subtracts_mean_but_never_divides():
    samples = [sample(0, 2), sample(1, 1)]
    out = A.compute_advantages(samples, [1.0, 0.25], cfg(), n_samples_per_prompt=1)
    assert values(out.advantages) == [[0.0, 0.0], [0.0]]  # each group of one: r - r, no NaN from std


def test_fan_out_batch_is_one_group():
    # n = 2 but group 0 has 3 samples (an agent rollout fanned out): the whole batch is one group
    samples = [sample(0, 1), sample(0, 1), sample(0, 1)]
    out = A.compute_advantages(samples, [3.0, 0.0, 0.0], cfg(), n_samples_per_prompt=2)
    # mean 1 -> centred 2, -1, -1; unbiased var = (4 + 1 + 1) / 2 = 3
    s = math.sqrt(3) + 1e-6
    assert_close(values(out.advantages), [[2 / s], [-1 / s], [-1 / s]])
    assert A.groups_of(samples, 3) == [[0, 1, 2]]
    assert A.groups_of([sample(0, 1), sample(1, 1), sample(0, 1), sample(1, 1)], 2) == [[0, 2], [1, 3]]


def test_grpo_leaves_removed_samples_out_of_the_group_statistics():
    # group 0: rewards 1, 0, and a removed sample (a dead sandbox) with reward 0; group 1: 1, 1, 0 all valid
    samples = [sample(0, 1), sample(0, 1), sample(0, 1, remove_sample=True), sample(1, 1), sample(1, 1), sample(1, 1)]
    out = A.compute_advantages(samples, [1.0, 0.0, 0.0, 1.0, 1.0, 0.0], cfg(), n_samples_per_prompt=3)
    # group 0 over the valid two: mean 0.5, unbiased std sqrt(0.5) -> +-0.5 / (sqrt(0.5) + 1e-6); removed one 0
    # (with it, the mean would be 1/3 and the first sample's advantage 2/sqrt(3) = 1.155 instead of 0.707)
    s0 = math.sqrt(0.5) + 1e-6
    s1 = math.sqrt(1 / 3) + 1e-6  # group 1: mean 2/3, unbiased var 1/3
    want = [[0.5 / s0], [-0.5 / s0], [0.0], [(1 / 3) / s1], [(1 / 3) / s1], [(-2 / 3) / s1]]
    assert_close(values(out.advantages), want)


def test_grpo_group_with_one_valid_rollout_is_centred_not_divided():
    samples = [sample(0, 1), sample(0, 1, remove_sample=True)]
    out = A.compute_advantages(samples, [1.0, 0.0], cfg(), n_samples_per_prompt=2)
    assert values(out.advantages) == [[0.0], [0.0]]


def test_grpo_counts_an_agent_runs_branches_as_one_rollout():
    # n = 2 rollouts per group: run 7 forked into 3 samples (all with its reward 1), run 8 one sample (reward 0)
    samples = [sample(0, 1, rollout_id=7), sample(0, 1, rollout_id=7), sample(0, 1, rollout_id=7),
               sample(0, 1, rollout_id=8), sample(1, 1, rollout_id=9), sample(1, 1, rollout_id=10)]
    assert A.groups_of(samples, 2) == [[0, 1, 2, 3], [4, 5]]
    out = A.compute_advantages(samples, [1.0, 1.0, 1.0, 0.0, 0.5, 0.0], cfg(), n_samples_per_prompt=2)
    # group 0 over the rollouts' rewards (1, 0): mean 0.5, std sqrt(0.5); counting branches it would be 0.75
    s0 = math.sqrt(0.5) + 1e-6
    s1 = math.sqrt(0.125) + 1e-6  # group 1: 0.5, 0 -> mean 0.25, unbiased var 0.125
    want = [[0.5 / s0]] * 3 + [[-0.5 / s0], [0.25 / s1], [-0.25 / s1]]
    assert_close(values(out.advantages), want)


def test_group_centre_matches_a_group_by_group_reference_on_random_batches():
    import random
    import statistics

    rng = random.Random(0)
    for _ in range(200):
        size = rng.randint(1, 24)
        groups = [rng.choice([0, 3, 9]) for _ in range(size)]
        rewards = [rng.choice([0.0, 1.0, rng.random()]) for _ in range(size)]
        valid = [rng.random() > 0.2 for _ in range(size)]
        rollouts = [rng.randint(0, 4) for _ in range(size)]
        for divide in (True, False):
            got = A.group_centre(torch.tensor(rewards, dtype=torch.float64), torch.tensor(groups), divide,
                                 valid=torch.tensor(valid), rollouts=torch.tensor(rollouts)).tolist()
            want = [0.0] * size
            for g in set(groups):
                members = [i for i in range(size) if groups[i] == g and valid[i]]
                first = {rollouts[i]: i for i in reversed(members)}  # a rollout's first position
                stats = [rewards[i] for i in first.values()]
                for i in members:
                    want[i] = rewards[i] - statistics.fmean(stats) if stats else 0.0
                    if divide and len(stats) > 1:
                        want[i] /= statistics.stdev(stats) + A.STD_EPS
            assert got == pytest.approx(want, abs=1e-9)


def test_reinforce_plus_plus_kl_reward_discount_then_whiten():
    c = cfg(advantage_estimator="reinforce_plus_plus", kl_coef=0.5, gamma=0.9)
    samples = [sample(0, 3, mask=[1, 1, 0]), sample(1, 2)]
    kl = [torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.0, 0.4])]
    est = A.estimate(samples, [1.0, 0.0], c, 1, kl=kl)
    # sample 0: token rewards -0.5*kl on trainable tokens = -0.05, -0.1, 0 (masked); reward 1 at the last
    # trainable token (index 1) -> -0.05, 0.9, 0. Returns backwards: G2 = 0, G1 = 0.9, G0 = -0.05 + 0.9*0.9 = 0.76
    # sample 1: token rewards 0, -0.2 (reward 0 on index 1) -> G1 = -0.2, G0 = 0.9 * -0.2 = -0.18
    assert_close(values(est.returns), [[0.76, 0.9, 0.0], [-0.18, -0.2]])
    out = A.compute_advantages(samples, [1.0, 0.0], c, 1, kl=kl)
    # whitening over the 4 valid tokens 0.76, 0.9, -0.18, -0.2: mean 0.32,
    # deviations 0.44, 0.58, -0.5, -0.52; population var = (0.1936 + 0.3364 + 0.25 + 0.2704) / 4 = 0.2626
    s = math.sqrt(0.2626 + 1e-8)
    assert_close(values(out.advantages), [[0.44 / s, 0.58 / s, 0.0], [-0.5 / s, -0.52 / s]])
    assert_close(values(out.returns), [[0.76, 0.9, 0.0], [-0.18, -0.2]])


def test_reinforce_plus_plus_needs_kl_when_kl_coef_set():
    with pytest.raises(ValueError, match="kl_coef"):
        A.estimate([sample(0, 1)], [1.0], cfg(advantage_estimator="reinforce_plus_plus", kl_coef=0.1), 1)


def test_reinforce_plus_plus_baseline_group_mean_then_whiten():
    c = cfg(advantage_estimator="reinforce_plus_plus_baseline")
    samples = [sample(0, 2), sample(0, 1), sample(1, 1, remove_sample=True), sample(1, 1)]
    out = A.compute_advantages(samples, [1.0, 0.0, 5.0, 5.0], c, 2)
    # centred: group 0 -> 0.5, -0.5; group 1 -> 0 for the kept one (the removed one is left out: 0)
    # valid tokens: 0.5, 0.5, -0.5, 0 (removed one excluded): mean 1/8; deviations 3/8, 3/8, -5/8, -1/8
    # population var = (9 + 9 + 25 + 1) / 64 / 4 = 44/256
    s = math.sqrt(44 / 256 + 1e-8)
    assert_close(values(out.advantages), [[0.375 / s] * 2, [-0.625 / s], [0.0], [-0.125 / s]])


def test_apply_opd_hand_values_for_lists_and_tensors():
    adv = [torch.tensor([1.0, 1.0])]
    got = A.apply_opd(adv, [torch.tensor([-1.0, -2.0])], [torch.tensor([-1.5, -1.0])], 0.5)
    # student - teacher = 0.5, -1 -> 1 - 0.25, 1 + 0.5
    assert values(got) == [[0.75, 1.5]]
    t = A.apply_opd(torch.ones(1, 2), torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]]), 0.5)
    assert t.tolist() == [[0.75, 1.5]]
    assert A.apply_opd(adv, [torch.zeros(2)], [torch.ones(2)], 0.0)[0] is adv[0]


def test_opd_is_applied_before_whitening():
    c = cfg(advantage_estimator="reinforce_plus_plus_baseline", opd_kl_coef=1.0)
    samples = [sample(0, 1, teacher_log_probs=[0.0]), sample(0, 1, teacher_log_probs=[-1.0])]
    out = A.compute_advantages(samples, [1.0, 0.0], c, 2, student_logp=[torch.zeros(1), torch.zeros(1)])
    # estimator: 0.5, -0.5; OPD: student - teacher = 0, 1 -> 0.5, -1.5; whiten: mean -0.5, var 1 -> 1, -1
    # (whitening first would give 1, -1 and then OPD 1, -2)
    assert_close(values(out.advantages), [[1.0], [-1.0]])


def test_opd_requires_student_and_teacher():
    c = cfg(opd_kl_coef=0.5)
    with pytest.raises(ValueError, match="student"):
        A.compute_advantages([sample(0, 1)], [1.0], c, 1)
    with pytest.raises(ValueError, match="teacher"):
        A.compute_advantages([sample(0, 1)], [1.0], c, 1, student_logp=[torch.zeros(1)])


def test_whiten_across_ranks_equals_whole_batch():
    a = [torch.tensor([1.0, 2.0]), torch.tensor([4.0])]
    b = [torch.tensor([0.0, 7.0, 3.0])]
    ma, mb = [torch.ones(2), torch.ones(1)], [torch.tensor([1.0, 0.0, 1.0])]
    whole = A.whiten(a + b, ma + mb)
    other = A.whiten_stats(b, mb)
    split = A.whiten(a, ma, all_reduce=lambda s: s + other)
    assert values(split) == values(whole[:2])
    # valid: 1, 2, 4, 0, 3 -> mean 2, var (1 + 0 + 4 + 4 + 1) / 5 = 2
    s = math.sqrt(2 + 1e-8)
    assert_close(values(whole), [[-1 / s, 0.0], [2 / s], [-2 / s, 0.0, 1 / s]])


def test_rewards_must_match_samples():
    with pytest.raises(ValueError, match="rewards"):
        A.estimate([sample(0, 1)], [1.0, 2.0], cfg(), 1)
