"""Loss formulas against hand computations (numbers worked out in the comments)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from slimecli.config.groups.trainer import TrainerConfig
from slimecli.rollout.sample import Sample
from slimecli.train import losses as L


def cfg(**kw) -> TrainerConfig:
    return dataclasses.replace(TrainerConfig(), **kw)


def test_log_probs_at_temperature_and_chunking():
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, math.log(2.0)]], requires_grad=True)
    targets = torch.tensor([2, 0])
    got = L.log_probs_from_logits(logits, targets, temperature=2.0, chunk_size=1)
    # row 0 at T = 2: scaled 0.5, 1, 1.5 -> 1.5 - log(e^0.5 + e^1 + e^1.5)
    want0 = 1.5 - math.log(math.exp(0.5) + math.exp(1.0) + math.exp(1.5))
    # row 1 at T = 2: scaled 0, 0, log(2)/2 -> 0 - log(1 + 1 + sqrt(2))
    want1 = -math.log(2 + math.sqrt(2))
    assert got.tolist() == pytest.approx([want0, want1], abs=1e-6)
    assert L.log_probs_from_logits(logits, targets, 2.0).tolist() == pytest.approx(got.tolist(), abs=1e-7)
    got.sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    at_t1 = L.log_probs_from_logits(torch.tensor([[0.0, 0.0, math.log(2.0)]]), torch.tensor([2]), 1.0)
    assert at_t1.item() == pytest.approx(math.log(0.5), abs=1e-6)  # softmax = 1/4, 1/4, 1/2
    with pytest.raises(ValueError, match="temperature"):
        L.log_probs_from_logits(logits, targets, 0.0)


def test_log_probs_keep_leading_shape():
    logits = torch.zeros(2, 3, 4)
    out = L.log_probs_from_logits(logits, torch.zeros(2, 3, dtype=torch.long), chunk_size=4)
    assert out.shape == (2, 3)
    assert torch.allclose(out, torch.full((2, 3), math.log(0.25)))


def test_entropy_hand_values():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -1e9, -1e9]])
    got = L.entropy_from_logits(logits, 1.0, chunk_size=1)
    # uniform over 4 -> log 4; p = 1/4, 3/4 -> -(1/4 log 1/4 + 3/4 log 3/4)
    assert got.tolist() == pytest.approx([math.log(4), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))], abs=1e-6)
    # at T = 2, logits 0, log 9 become 0, log 3: same 1/4, 3/4 split
    two = L.entropy_from_logits(torch.tensor([[0.0, math.log(9.0)]]), 2.0)
    assert two.item() == pytest.approx(got[1].item(), abs=1e-6)


@pytest.mark.parametrize("temperature,chunk_size", [(1.0, 4096), (0.7, 5)])
def test_log_probs_and_entropy_equal_autograd_through_log_softmax(temperature, chunk_size):
    torch.manual_seed(0)
    logits = (torch.randn(3, 7, 50) * 3).requires_grad_()
    targets = torch.randint(0, 50, (3, 7))

    def reference():
        logp_all = torch.log_softmax(logits / temperature, dim=-1)
        return logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)

    logp, entropy = L.log_probs_and_entropy(logits, targets, temperature, chunk_size=chunk_size)
    want_logp, want_entropy = reference()
    assert logp.shape == entropy.shape == (3, 7) and not entropy.requires_grad  # a metric: out of the graph
    assert torch.allclose(logp, want_logp, atol=1e-5) and torch.allclose(entropy, want_entropy, atol=1e-5)
    assert torch.allclose(L.log_probs_from_logits(logits, targets, temperature, chunk_size), want_logp, atol=1e-5)
    assert torch.allclose(L.entropy_from_logits(logits, temperature, chunk_size), want_entropy, atol=1e-5)
    weights = torch.rand(3, 7)  # a weighted loss, as the policy loss is
    (got,) = torch.autograd.grad((logp * weights).sum(), logits)
    (want,) = torch.autograd.grad((want_logp * weights).sum(), logits)
    assert torch.allclose(got, want, atol=1e-6)
    for entropy_coef in (0.1, 0.0):  # an entropy bonus; the entropy alone (no gradient reaches the log-probs)
        logp, entropy = L.log_probs_and_entropy(logits, targets, temperature, entropy_grad=True, chunk_size=chunk_size)
        want_logp, want_entropy = reference()
        got_loss = (entropy * weights).sum() if not entropy_coef else (logp - entropy_coef * entropy).sum()
        want_loss = (want_entropy * weights).sum() if not entropy_coef else (want_logp - entropy_coef * want_entropy).sum()
        (got,) = torch.autograd.grad(got_loss, logits)
        (want,) = torch.autograd.grad(want_loss, logits)
        assert torch.allclose(got, want, atol=1e-5)


def test_log_probs_of_a_peaked_distribution_stay_finite():
    """A target far below the top logit: its log-prob is large and negative, never -inf or nan."""
    logits = torch.tensor([[0.0, -150.0, -1000.0]], requires_grad=True)
    logp, entropy = L.log_probs_and_entropy(logits, torch.tensor([[2]]).squeeze(0), 1.0)
    assert logp.item() == pytest.approx(-1000.0, rel=1e-6) and entropy.item() >= 0.0
    (grad,) = torch.autograd.grad(logp.sum(), logits)
    assert grad[0].tolist() == pytest.approx([-1.0, 0.0, 1.0], abs=1e-6)  # onehot - softmax


def test_ppo_clip_and_dual_clip_hand_values():
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, 1.0])
    ratio = torch.tensor([1.5, 0.9, 0.5, 3.0, 3.0])
    loss, clipped, dual = L.ppo_clip_loss(ratio.log(), adv, eps_clip=0.2)
    # A=1,r=1.5: max(-1.5, -1.2) = -1.2 (clipped); A=1,r=0.9: -0.9; A=-1,r=0.5: max(0.5, 0.8) = 0.8 (clipped)
    # A=-1,r=3: max(3, 1.2) = 3; A=1,r=3: max(-3, -1.2) = -1.2 (clipped)
    assert loss.tolist() == pytest.approx([-1.2, -0.9, 0.8, 3.0, -1.2], abs=1e-6)
    assert clipped.tolist() == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert dual.tolist() == [0.0] * 5
    loss, _, dual = L.ppo_clip_loss(ratio.log(), adv, eps_clip=0.2, eps_clip_c=2.0)
    # dual clip caps A<0 losses at -c*A = 2: only the A=-1, r=3 token changes (3 -> 2); A>0 untouched
    assert loss.tolist() == pytest.approx([-1.2, -0.9, 0.8, 2.0, -1.2], abs=1e-6)
    assert dual.tolist() == [0.0, 0.0, 0.0, 1.0, 0.0]
    loss, _, _ = L.ppo_clip_loss(ratio.log(), adv, eps_clip=0.2, eps_clip_high=0.3)
    # upper bound 1.3: A=1,r=1.5 -> -1.3; lower bound still 0.8
    assert loss.tolist() == pytest.approx([-1.3, -0.9, 0.8, 3.0, -1.3], abs=1e-6)
    with pytest.raises(ValueError, match="> 1"):
        L.ppo_clip_loss(ratio.log(), adv, 0.2, eps_clip_c=1.0)


def test_kl_estimators():
    logp = torch.tensor([0.5, -1.0, 20.0, -20.0])
    ref = torch.zeros(4)
    assert L.kl_penalty(logp, ref, "k1").tolist() == pytest.approx([0.5, -1.0, 20.0, -20.0])
    assert L.kl_penalty(logp, ref, "k2").tolist() == pytest.approx([0.125, 0.5, 200.0, 200.0])
    # e^-lr - 1 + lr: e^-0.5 - 0.5 = 0.1065307; e^1 - 2 = 0.7182818; lr = 20 -> 19.0 and lr = -20 -> huge: clamp 10
    assert L.kl_penalty(logp, ref, "low_var_kl").tolist() == pytest.approx(
        [math.exp(-0.5) - 0.5, math.e - 2, 10.0, 10.0], abs=1e-6)
    with pytest.raises(ValueError):
        L.kl_penalty(logp, ref, "k9")


def test_gspo_sequence_ratio_uses_masked_mean_per_row():
    logp = torch.tensor([[0.1, 0.3, 5.0], [0.2, 9.0, 9.0]])
    old = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    got = L.gspo_log_ratio(logp, old, mask)
    assert got.flatten().tolist() == pytest.approx([0.2] * 6)  # (0.1 + 0.3) / 2; 0.2 / 1


def _s(mask: list[int], rollout_id: int | None = None, remove: bool = False) -> Sample:
    return Sample(tokens=[1] * (2 + len(mask)), response_length=len(mask), loss_mask=mask, rollout_id=rollout_id,
                  remove_sample=remove)


def test_loss_weights_per_rollout_and_per_token():
    samples = [_s([1, 1, 0], rollout_id=7), _s([1], rollout_id=7), _s([1, 1, 1, 1]), _s([1, 1], remove=True)]
    w = [t.tolist() for t in L.loss_weights(samples, "per_rollout")]
    # rollouts: id 7 (mask total 3), sample 2 (4), sample 3 (removed: 0, still counted) -> 3 rollouts
    assert w[0] == pytest.approx([1 / 9, 1 / 9, 0.0])
    assert w[1] == pytest.approx([1 / 9])
    assert w[2] == pytest.approx([1 / 12] * 4)
    assert w[3] == [0.0, 0.0]
    t = [x.tolist() for x in L.loss_weights(samples, "per_token")]
    assert t == [pytest.approx([1 / 7, 1 / 7, 0.0]), pytest.approx([1 / 7]), pytest.approx([1 / 7] * 4), [0.0, 0.0]]
    with pytest.raises(ValueError):
        L.loss_weights(samples, "per_moon")


def test_policy_loss_hand_value_and_gradient():
    c = cfg(eps_clip=0.2, entropy_coef=0.1, kl_loss_coef=0.5, kl_loss_type="k1")
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = logp.detach() - torch.tensor([[0.0, math.log(1.5)]])  # ratios 1, 1.5
    adv = torch.ones(1, 2)
    weights = torch.tensor([[0.5, 0.5]])
    entropy = torch.tensor([[0.3, 0.5]])
    ref = logp.detach() - torch.tensor([[0.2, 0.4]])  # k1 = 0.2, 0.4
    loss, m = L.policy_loss(logp, old, adv, weights, c, entropy=entropy, ref_logp=ref)
    # pg: -1*1 and -clip(1.5)=-1.2 -> 0.5*(-1 - 1.2) = -1.1; entropy 0.4 -> -0.04; kl 0.3 -> +0.15
    assert loss.item() == pytest.approx(-1.1 - 0.04 + 0.15, abs=1e-6)
    assert m["pg_loss"].item() == pytest.approx(-1.1, abs=1e-6)
    assert m["pg_clipfrac"].item() == pytest.approx(0.5)
    assert m["entropy"].item() == pytest.approx(0.4)
    assert m["kl"].item() == pytest.approx(0.3, abs=1e-6)
    assert m["ppo_kl"].item() == pytest.approx(-0.5 * math.log(1.5), abs=1e-6)  # mean(old - new)
    loss.backward()
    # d/dlogp: token 0 pg -A*r*w = -0.5, kl 0.5*0.5 = 0.25 -> -0.25; token 1 clipped (no pg grad) -> 0.25
    assert logp.grad[0].tolist() == pytest.approx([-0.25, 0.25], abs=1e-6)


def test_policy_loss_importance_weights_multiply_pg():
    c = cfg(tis_clip_low=0.1, tis_clip_high=2.0)
    logp = torch.tensor([[-1.0, -2.0]])
    old = logp - torch.tensor([[0.0, math.log(1.5)]])  # ratios 1, 1.5 -> token losses -1, -1.2
    weights = torch.tensor([[2.0, 0.5]])
    loss, _ = L.policy_loss(logp, old, torch.ones(1, 2), torch.tensor([[0.5, 0.5]]), c, is_weights=weights)
    assert loss.item() == pytest.approx(0.5 * (-1 * 2) + 0.5 * (-1.2 * 0.5), abs=1e-6)  # -1.3
    plain, _ = L.policy_loss(logp, old, torch.ones(1, 2), torch.tensor([[0.5, 0.5]]), c)
    assert plain.item() == pytest.approx(0.5 * -1 + 0.5 * -1.2, abs=1e-6)


def test_policy_loss_gspo_sequence_ratio_and_gradient():
    c = cfg(importance_level="sequence", eps_clip=0.2)  # what advantage_estimator=gspo is read as
    logp = torch.tensor([[0.1, 0.3, 0.0]], requires_grad=True)
    weights = torch.tensor([[0.5, 0.5, 0.0]])
    loss, _ = L.policy_loss(logp, torch.zeros(1, 3), -torch.ones(1, 3), weights, c)
    # sequence ratio e^0.2 = 1.2214 for both tokens; A = -1: max(1.2214, 1.2) = 1.2214
    r = math.exp(0.2)
    assert loss.item() == pytest.approx(r, abs=1e-6)
    loss.backward()
    # d(r)/dlogp_t = r / 2 for each valid token (mean over 2), masked token 0
    assert logp.grad[0].tolist() == pytest.approx([r / 2, r / 2, 0.0], abs=1e-6)


def test_policy_loss_requires_inputs_for_enabled_terms():
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="entropy"):
        L.policy_loss(x, x, x, x, cfg(entropy_coef=0.1))
    with pytest.raises(ValueError, match="reference"):
        L.policy_loss(x, x, x, x, cfg(kl_loss_coef=0.1))


def test_micro_batches_add_up_to_the_step_loss_and_removed_sample_has_no_gradient():
    samples = [_s([1, 1], rollout_id=1), _s([1, 0, 1], rollout_id=1), _s([1]), _s([1, 1], remove=True)]
    weights = L.loss_weights(samples)
    torch.manual_seed(0)
    logp = [torch.randn(s.response_length, requires_grad=True) for s in samples]
    old = [t.detach() + 0.1 * torch.randn_like(t) for t in logp]
    adv = [torch.full((s.response_length,), a) for s, a in zip(samples, [1.0, -0.5, 2.0, 3.0], strict=True)]
    c = cfg()

    def run(idx: list[int]) -> torch.Tensor:
        pick = lambda xs: L.pad_sequences([xs[i] for i in idx])  # noqa: E731
        logp_b = torch.nn.utils.rnn.pad_sequence([logp[i] for i in idx], batch_first=True)
        return L.policy_loss(logp_b, pick(old), pick(adv), pick(weights), c)[0]

    whole = run([0, 1, 2, 3])
    parts = run([0, 2]) + run([1, 3])
    assert whole.item() == pytest.approx(parts.item(), abs=1e-6)
    whole.backward()
    assert logp[3].grad is not None and logp[3].grad.abs().sum().item() == 0.0
    assert logp[0].grad.abs().sum().item() > 0


def test_pad_sequences():
    out = L.pad_sequences([[1.0, 2.0], [3.0]], value=-1.0)
    assert out.tolist() == [[1.0, 2.0], [3.0, -1.0]]
