"""The algorithms chosen by config value, each on a small fixed batch with its outputs pinned (like the stage tests):
CISPO (trainer.policy_loss=cispo), DAPO's overlong shaping (trainer.overlong_buffer), Dr. GRPO's reduction
(trainer.loss_reduction=token_sum_norm) and PPO with a critic (trainer.advantage_estimator=gae, trainer.critic.*),
on one rank and on two; and their config errors. Each pinned number is also checked against an independent
computation (by hand, or autograd on a direct formula) where one exists.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import pytest
import torch

from slimecli.checkpoint import store
from slimecli.train import critic as critic_stages
from slimecli.train import losses as L
from slimecli.train import stages
from slimecli.train.advantages import gae_from_values
from slimecli.train.critic import Critic, ValueModel
from slimecli.train.shaping import overlong_penalty, shape_rewards
from slimecli.train.stages import StepTensors
from tests.helpers import invoke_cli
from tests.test_train_stages import (
    CTX,
    RTOL,
    TinyLM,
    checksum,
    close,
    flat,
    make_batch,
    make_cfg,
    make_samples,
    torch_policy,
)


# ---- CISPO ---------------------------------------------------------------------------------------------------
def test_cispo_weights_are_clipped_and_detached_never_the_token():
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    ratios = torch.tensor([[1.0, 1.5, 0.5]])
    old = logp.detach() - ratios.log()
    adv = torch.tensor([[1.0, 1.0, -2.0]])
    cfg = make_cfg(policy_loss="cispo", cispo_eps_high=0.2, cispo_eps_low=1.0).trainer
    weights = torch.full((1, 3), 1 / 3)
    loss, metrics = L.policy_loss(logp, old, adv, weights, cfg)
    # weights sg(clip(r, 0, 1.2)) = 1, 1.2, 0.5; the value is -w * A per token: -1, -1.2, +1 -> mean -0.4/3
    assert loss.item() == pytest.approx((-1.0 - 1.2 + 1.0) / 3, abs=1e-6)
    assert metrics["pg_clipfrac"].item() == pytest.approx(1 / 3)
    loss.backward()
    # independent: the gradient of -sum(sg(w) * A * logp) * 1/3, where PPO's clip would give token 1 none
    want = (-torch.tensor([1.0, 1.2, 0.5]) * adv[0] / 3).tolist()
    assert logp.grad[0].tolist() == pytest.approx(want, abs=1e-6)
    # a lower bound: eps_low 0.2 lifts the weight of ratio 0.5 to 0.8
    low = L.cispo_loss(torch.log(torch.tensor([0.5])), torch.tensor([1.0]), 0.2, 0.2)
    assert low[0].item() == pytest.approx(-0.8) and low[1].item() == 1.0


def test_update_stage_with_cispo_pinned():
    """Two updates on the stage tests' batch: the second is off-policy, and half its tokens' weights clip at
    1 - eps_low (ppo_clip at eps 0.2 clips none of them: the same batch gives pg_loss 0.0009048 there)."""
    model, batch = TinyLM(0), make_batch()
    cfg = make_cfg(global_batch_size=2, micro_batch_size=1, policy_loss="cispo", cispo_eps_low=0.05,
                   cispo_eps_high=0.01)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    old = stages.old_logp(torch_policy(model), batch, cfg.trainer, CTX, has_ref=False)
    tensors = StepTensors(old, None, stages.advantages(batch, old, None, cfg.trainer, 2))
    metrics = stages.update(torch_policy(model, optimizer), scheduler, batch, tensors, cfg, CTX)
    assert metrics == pytest.approx({"train/pg_loss": PINNED_CISPO[0], "train/pg_clipfrac": PINNED_CISPO[1],
                                     "train/ppo_kl": PINNED_CISPO[2], "train/entropy": PINNED_CISPO[3],
                                     "train/loss": PINNED_CISPO[0], "train/grad_norm": PINNED_CISPO[4],
                                     "train/lr": 0.5, "train/updates": 2}, rel=RTOL, abs=1e-6)
    assert checksum(model) == pytest.approx(PINNED_CISPO_CHECKSUM, rel=RTOL)
    # the first update is on-policy: every weight is 1, so its gradient is REINFORCE's, as with ppo_clip
    ppo, _ = run_first_update("ppo_clip")
    cispo, _ = run_first_update("cispo")
    close(flat([p.detach() for p in cispo.parameters()]), flat([p.detach() for p in ppo.parameters()]))


PINNED_CISPO = (0.00036673, 0.25, 0.0208945, 2.3526434, 0.6898277)  # pg_loss, clipfrac, ppo_kl, entropy, norm
PINNED_CISPO_CHECKSUM = (-8.951066, 79.310173)


def run_first_update(loss: str) -> tuple[TinyLM, dict[str, float]]:
    model, batch = TinyLM(0), make_batch()
    cfg = make_cfg(global_batch_size=4, micro_batch_size=2, policy_loss=loss)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    tensors = StepTensors(None, None, stages.advantages(batch, None, None, cfg.trainer, 2))
    return model, stages.update(torch_policy(model, optimizer), scheduler, batch, tensors, cfg, CTX)


# ---- DAPO's overlong shaping ---------------------------------------------------------------------------------
def test_overlong_penalty_falls_linearly_over_the_buffer():
    got = overlong_penalty(torch.tensor([2, 4, 5, 7, 8, 9]), max_len=8, buffer=4, factor=0.5)
    # no penalty up to 8 - 4 = 4 tokens, then -0.5 * (len - 4) / 4, capped at -0.5
    assert got.tolist() == pytest.approx([0.0, 0.0, -0.125, -0.375, -0.5, -0.5])
    with pytest.raises(ValueError, match="overlong buffer must be in 1..8"):
        overlong_penalty(torch.tensor([1]), max_len=8, buffer=9, factor=1.0)


def test_overlong_stage_shapes_the_advantages_not_the_logged_rewards():
    cfg = make_cfg(overlong_buffer=1, overlong_penalty=0.5)
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, max_new_tokens=3))
    batch = make_batch()  # response lengths 3, 2, 3, 2 of a budget of 3: the 3s lose 0.5
    shaped, metrics = stages.overlong(batch, cfg)
    assert shaped.rewards == pytest.approx([0.5, 0.0, 0.0, 0.0]) and batch.rewards == [1.0, 0.0, 0.5, 0.0]
    assert metrics == pytest.approx({"reward/overlong_penalty_mean": -0.25, "reward/overlong_frac": 0.5})
    adv = stages.advantages(shaped, None, None, cfg.trainer, 2).advantages
    # grpo on the shaped rewards: group 0 (0.5, 0) -> +-0.7071, group 1 (0, 0) -> 0
    close(flat(adv), [0.707106, 0.707106, 0.707106, -0.707106, -0.707106, 0.0, 0.0, 0.0, 0.0, 0.0], rtol=1e-5)
    assert stages.overlong(batch, make_cfg()) == (batch, {})
    assert shape_rewards([1.0], [5], 8, 0, 1.0) == ([1.0], {})


# ---- Dr. GRPO ------------------------------------------------------------------------------------------------
def test_token_sum_norm_weights_every_token_alike_by_the_budget():
    samples = make_samples()  # masks [1,1,1], [1,1], [1,0,1], [1,1]
    weights = L.loss_weights(samples, "token_sum_norm", norm_tokens=8)
    close(flat(weights), [v / 8 / 4 for v in (1, 1, 1, 1, 1, 1, 0, 1, 1, 1)])
    with pytest.raises(ValueError, match="token_sum_norm needs a positive token count"):
        L.loss_weights(samples, "token_sum_norm")
    cfg = make_cfg(loss_reduction="token_sum_norm")
    assert flat(stages.update_weights(samples, cfg)) == flat(L.loss_weights(samples, "token_sum_norm",
                                                                            norm_tokens=cfg.rollout.max_new_tokens))


# ---- PPO with a critic: GAE and the value loss ---------------------------------------------------------------
def gae_by_hand(rewards: list[float], values: list[float], mask: list[int], gamma: float, lam: float
                ) -> tuple[list[float], list[float]]:
    """One row, the trainable tokens taken out and run through the textbook recursion, then put back."""
    live = [t for t, m in enumerate(mask) if m]
    adv = [0.0] * len(mask)
    running, next_value = 0.0, 0.0
    for t in reversed(live):
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        adv[t], next_value = running, values[t]
    return adv, [a + (v if m else 0.0) for a, v, m in zip(adv, values, mask, strict=True)]


def test_gae_steps_over_context_tokens_and_matches_the_recursion():
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.5, 0.0]])
    values = torch.tensor([[0.2, 0.4, 9.0, 0.6], [0.1, 0.3, 0.5, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    adv, returns = gae_from_values(rewards, values, mask, gamma=0.9, lam=0.8)
    for i in range(2):
        want_adv, want_ret = gae_by_hand(rewards[i].tolist(), values[i].tolist(), mask[i].tolist(), 0.9, 0.8)
        close(adv[i].tolist(), want_adv)
        close(returns[i].tolist(), want_ret)
    # pinned: row 0 ends 1 - 0.6 = 0.4; before the context token 0.9*0.6 - 0.4 + 0.72*0.4 = 0.428, then
    # 0.9*0.4 - 0.2 + 0.72*0.428 = 0.46816
    close(adv[0].tolist(), [0.46816, 0.428, 0.0, 0.4])
    # gamma = lam = 1: the advantage is the return minus the value, the return the reward-to-go
    adv, returns = gae_from_values(rewards, values, mask, gamma=1.0, lam=1.0)
    close(returns[0].tolist(), [1.0, 1.0, 0.0, 1.0])
    close(adv[0].tolist(), [0.8, 0.6, 0.0, 0.4])


def test_value_loss_clips_around_the_old_values():
    values = torch.tensor([1.0, 0.0, 0.5], requires_grad=True)
    old = torch.tensor([0.0, 0.0, 0.4])
    returns = torch.tensor([2.0, 1.0, 0.0])
    loss, clipped = L.value_loss(values, old, returns, clip=0.5)
    # token 0: (1-2)^2 = 1 vs clipped (0.5-2)^2 = 2.25 -> 1.125; token 1: 0.5; token 2: 0.25 vs 0.81^... clip ok
    assert loss.tolist() == pytest.approx([1.125, 0.5, 0.125])
    assert clipped.tolist() == [1.0, 0.0, 0.0]
    loss.sum().backward()
    assert values.grad.tolist() == pytest.approx([0.0, -1.0, 0.5])  # the clipped token has no gradient
    plain, none = L.value_loss(values.detach(), old, returns, clip=None)
    assert plain.tolist() == pytest.approx([0.5, 0.5, 0.125]) and none.sum() == 0


class Hidden(NamedTuple):
    last_hidden_state: torch.Tensor


class TinyDecoder(torch.nn.Module):
    """TinyLM without its head: the hidden state of a causal running mean of token embeddings."""

    def __init__(self, seed: int, vocab: int = 12, hidden: int = 8):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(vocab, hidden)

    def forward(self, input_ids: torch.Tensor, use_cache: bool = False) -> Hidden:
        h = torch.tanh(self.embed(input_ids))
        steps = torch.arange(1, input_ids.shape[1] + 1, dtype=h.dtype).view(1, -1, 1)
        return Hidden(h.cumsum(1) / steps)


def value_model(seed: int = 0) -> ValueModel:
    model = ValueModel(TinyDecoder(seed), 8)
    with torch.no_grad():  # a head that says something (a fresh one says 0 everywhere)
        model.value_head.weight.copy_(torch.linspace(-0.5, 0.5, 8).view(1, 8))
        model.value_head.bias.fill_(0.1)
    return model


def critic_of(model: torch.nn.Module, ctx: Any = CTX) -> Critic:
    return Critic(model, torch.optim.SGD(model.parameters(), lr=0.5), clip_grad=0.0, value_clip=0.2,
                  data_rank=ctx.rank, data_size=ctx.world_size)


def gae_cfg(**trainer: Any) -> Any:
    return make_cfg(advantage_estimator="gae", gamma=0.9, global_batch_size=2, micro_batch_size=1, **trainer)


def direct_values(model: ValueModel, tokens: list[int], response_length: int) -> list[float]:
    """Independent: one unpadded forward; the value of each response token is read where its logits are."""
    with torch.no_grad():
        hidden = model.decoder(torch.tensor([tokens])).last_hidden_state[0]
        start = len(tokens) - response_length
        return model.value_head(hidden[start - 1:-1]).view(-1).tolist()


def test_critic_values_then_gae_advantages_pinned():
    model, batch = value_model(), make_batch()
    values = critic_stages.values(critic_of(model), batch, CTX)
    for s, v in zip(batch.samples, values, strict=True):
        close(v.tolist(), direct_values(model, s.tokens, s.response_length))
    cfg = gae_cfg()
    out = stages.advantages(batch, None, None, cfg.trainer, 2, values)
    # the returns are GAE's targets (lam 1: the discounted reward-to-go), the advantages those whitened
    for s, r, v, ret in zip(batch.samples, batch.rewards, values, out.returns, strict=True):
        mask = s.effective_loss_mask()
        rewards = [0.0] * s.response_length
        rewards[max(t for t, m in enumerate(mask) if m)] = r
        close(ret.tolist(), gae_by_hand(rewards, v.tolist(), mask, 0.9, 1.0)[1])
    close(flat(out.advantages), PINNED_GAE_ADVANTAGES, rtol=1e-4)


PINNED_GAE_ADVANTAGES = [0.696808, 1.427372, 1.446581, -1.497238, -0.72225, 0.191916, 0.0, 0.187055, -1.026999,
                         -0.703246]


def test_critic_update_pinned_and_learns_the_returns():
    model, batch = value_model(), make_batch()
    critic, cfg = critic_of(model), gae_cfg()
    values = critic_stages.values(critic, batch, CTX)
    adv = stages.advantages(batch, None, None, cfg.trainer, 2, values)
    metrics = critic_stages.update(critic, batch, values, adv, cfg, CTX)
    assert metrics == pytest.approx(PINNED_CRITIC_METRICS, rel=RTOL, abs=1e-6)
    assert critic_checksum(model) == pytest.approx(PINNED_CRITIC_CHECKSUM, rel=RTOL)
    # the value loss falls, update after update, on the same targets
    losses = [metrics["critic/value_loss"]]
    for _ in range(10):
        again = critic_stages.update(critic, batch, critic_stages.values(critic, batch, CTX), adv, cfg, CTX)
        losses.append(again["critic/value_loss"])
    assert losses[-1] < 0.8 * losses[0] and all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses


PINNED_CRITIC_METRICS = {"critic/value_loss": 0.078205, "critic/vf_clipfrac": 0.0, "critic/values_mean": 0.5293522,
                         "critic/returns_mean": 0.3445834, "critic/grad_norm": 0.2877912}
PINNED_CRITIC_CHECKSUM = (4.7488585, 79.357773)


def critic_checksum(model: ValueModel) -> tuple[float, float]:
    head = model.value_head.weight.detach().view(-1) * torch.arange(1, 9, dtype=torch.float32)
    return float(head.sum() + model.value_head.bias.detach().sum()), float(model.decoder.embed.weight.detach().abs().sum())


def test_critic_state_travels_in_the_checkpoint(tmp_path):
    model = value_model()
    critic = critic_of(model)
    batch, cfg = make_batch(), gae_cfg()
    values = critic_stages.values(critic, batch, CTX)
    critic_stages.update(critic, batch, values, stages.advantages(batch, None, None, cfg.trainer, 2, values), cfg, CTX)
    state = critic.state(is_main=True)
    assert critic.state(is_main=False) is None
    path = store.save(tmp_path, 1, {"w": torch.zeros(1)}, critic_state=state)
    assert (path / "critic.pt").is_file()
    restored = critic_of(value_model(seed=1))
    restored.load_state(store.load(path).critic_state)
    close(flat([p.detach() for p in restored.model.parameters()]), flat([p.detach() for p in model.parameters()]))
    assert store.load(store.save(tmp_path, 2, {"w": torch.zeros(1)})).critic_state is None


def ranked_critic_update(rank: int, world_size: int, port: int, out: Any) -> None:
    import os
    import sys

    import torch.distributed as torch_dist
    from torch.nn.parallel import DistributedDataParallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch_dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        ctx = dataclasses.replace(CTX, micro_batch_size=1, rank=rank, world_size=world_size)
        critic = critic_of(DistributedDataParallel(value_model()), ctx)
        batch, cfg = make_batch(), gae_cfg()
        values = critic_stages.values(critic, batch, ctx)
        adv = stages.advantages(batch, None, None, cfg.trainer, 2, values)
        metrics = critic_stages.update(critic, batch, values, adv, cfg, ctx)
        if rank == 0:
            out.put((metrics, [v.tolist() for v in values], {k: v.tolist() for k, v in critic.state(True)["model"].items()}))
    finally:
        torch_dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.mark.slow  # two spawned ranks: ~15 s on a loaded machine
def test_critic_on_two_ranks_matches_one_process():
    import torch.multiprocessing as mp

    from tests.helpers import free_port, wait_until

    model, batch = value_model(), make_batch()
    critic, cfg = critic_of(model), gae_cfg()
    values = critic_stages.values(critic, batch, CTX)
    adv = stages.advantages(batch, None, None, cfg.trainer, 2, values)
    want = critic_stages.update(critic, batch, values, adv, cfg, dataclasses.replace(CTX, micro_batch_size=1))
    queue = mp.get_context("spawn").SimpleQueue()
    ctx = mp.spawn(ranked_critic_update, args=(2, free_port(), queue), nprocs=2, join=False)
    wait_until(lambda: ctx.join(timeout=1), 120, "both ranks to finish the critic update", interval=0)
    metrics, ranked_values, state = queue.get()
    close([v for row in ranked_values for v in row], flat(values))
    for name, value in model.state_dict().items():
        close(flat([torch.tensor(state[name])]), flat([value]))
    assert metrics == pytest.approx(want, rel=RTOL, abs=1e-6)


def test_gae_without_values_is_an_error():
    with pytest.raises(ValueError, match="advantage_estimator=gae needs the critic's values"):
        stages.advantages(make_batch(), None, None, gae_cfg().trainer, 2)


# ---- config -------------------------------------------------------------------------------------------------
def _validate(*overrides: str) -> tuple[int, str]:
    out = invoke_cli("config", "validate", *overrides)
    return out.returncode, out.stdout + out.stderr


def test_algorithm_config_errors_name_their_fields():
    code, text = _validate("trainer.overlong_buffer=100", "trainer.cispo_eps_low=2", "trainer.critic.lam=1.5",
                           "trainer.critic.value_clip=0")
    assert code == 2, text
    assert "trainer.overlong_buffer: must be <= rollout.max_new_tokens (8)" in text
    assert "trainer.cispo_eps_low: must be in [0, 1]" in text
    assert "trainer.critic.lam: must be in [0, 1]" in text
    assert "trainer.critic.value_clip: must be > 0" in text
    assert "Traceback" not in text
    code, text = _validate("trainer.advantage_estimator=gae", "trainer=megatron", "trainer.strategy=fsdp",
                           "trainer.lora.rank=8")
    assert code == 2 and "trainer=megatron has no value model" in text, text
    assert "trainer.strategy=fsdp the policy is sharded" in text and "with trainer.lora" in text, text
    code, text = _validate("trainer.critic.lam=0.9", "trainer.cispo_eps_high=0.1", "trainer.overlong_penalty=0.5")
    assert code == 2, text
    assert "trainer.critic.lam: applies to a critic, which trainer.advantage_estimator=grpo has none of" in text
    assert "trainer.cispo_eps_high: applies to trainer.policy_loss=cispo, not ppo_clip" in text
    assert "trainer.overlong_penalty: applies to DAPO's overlong shaping, which is off" in text
    code, text = _validate("trainer.overlong_buffer=4", "env=reasoning_gym", "env.id=leg_counting")
    assert code == 2 and "shapes single-turn responses" in text, text
    # all of them at once: the critic takes KL reward shaping (PPO's), unlike grpo
    ok = _validate("trainer.policy_loss=cispo", "trainer.advantage_estimator=gae", "trainer.kl_coef=0.1",
                   "trainer.overlong_buffer=4", "trainer.loss_reduction=token_sum_norm", "trainer.scale_by_std=false")
    assert ok[0] == 0, ok[1]
