"""Per-token advantages and returns from a batch of Samples and their numeric rewards.

The trainer calls, in this order (``compute_advantages`` does all three):
  1. ``estimate(...)``         the configured estimator, looked up in the registry (registry.py)
  2. ``apply_opd(...)``        on-policy distillation: advantages -= coef * (student - teacher)
  3. ``finalize(...)``         whitening over the batch's valid tokens, for the estimators registered with whiten

Estimators are tensor in, tensor out: they see the step as padded [B, T] tensors (``AdvantageBatch``).
Around them, every per-sample quantity is a list with one 1-D float tensor per sample of length
``response_length``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import overload

import torch

from slimecli.config.groups.trainer import TrainerConfig
from slimecli.rollout.sample import Sample
from slimecli.train.registry import get_advantage_estimator

STD_EPS = 1e-6  # grpo: reward / (unbiased std + STD_EPS)
WHITEN_EPS = 1e-8  # whitening: (A - mean) / sqrt(var + WHITEN_EPS)

Tensors = list[torch.Tensor]


@dataclass
class Advantages:
    advantages: Tensors  # what the policy loss multiplies
    returns: Tensors  # reward-to-go before any OPD term or whitening (logged, and kept for a future critic)


@dataclass(frozen=True)
class AdvantageBatch:
    """What an estimator sees: one step's samples as right-padded [B, T] tensors (T = longest response)."""

    rewards: torch.Tensor  # [B] float64 training rewards
    mask: torch.Tensor  # [B, T] float32 loss mask: 0 for padding, context tokens and removed samples
    lengths: torch.Tensor  # [B] long: row i's response tokens are its first lengths[i] columns
    groups: torch.Tensor  # [B] long group id: the samples of one prompt (one group when groups are ragged)
    kl: torch.Tensor | None  # [B, T] per-token KL policy vs reference (for reward shaping), or None
    n_samples_per_prompt: int
    valid: torch.Tensor | None = None  # [B] bool: False for removed samples (aborted or masked agent runs)
    rollouts: torch.Tensor | None = None  # [B] long: samples of one rollout (an agent run's branches) share it
    values: torch.Tensor | None = None  # [B, T] the critic's value of the state before each token (gae), or None


def sample_masks(samples: Sequence[Sample]) -> Tensors:
    """Loss masks as float tensors; remove_sample gives all zeros (the sample stays in the batch)."""
    return [torch.tensor(s.effective_loss_mask(), dtype=torch.float32) for s in samples]


def rollout_keys(samples: Sequence[Sample]) -> list[int]:
    """One id per rollout: samples sharing a ``rollout_id`` (branches of one agent run) are one rollout."""
    ids: dict[tuple[str, int], int] = {}
    keys = [("rollout", s.rollout_id) if s.rollout_id is not None else ("sample", i) for i, s in enumerate(samples)]
    return [ids.setdefault(key, len(ids)) for key in keys]


def groups_of(samples: Sequence[Sample], n_samples_per_prompt: int) -> list[list[int]]:
    """Batch positions grouped by prompt.

    Groups are the samples sharing a ``group_index``, counted in rollouts (the branches of one agent run
    are one); when those groups do not all hold n rollouts (group_index left unset, or samples fanned out
    without a rollout_id) the whole batch is one group.
    """
    keys = rollout_keys(samples)
    by_group: dict[int, list[int]] = {}
    for i, s in enumerate(samples):
        by_group.setdefault(s.group_index, []).append(i)
    groups = list(by_group.values())
    if all(len({keys[i] for i in g}) == n_samples_per_prompt for g in groups):
        return groups
    return [list(range(len(samples)))]


def pad_rows(rows: Sequence[torch.Tensor], width: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Right-pad 1-D tensors with zeros into [B, width]."""
    out = torch.zeros((len(rows), width), dtype=dtype)
    for i, row in enumerate(rows):
        out[i, :row.numel()] = row.reshape(-1).to(dtype)
    return out


def unpad_rows(values: torch.Tensor, lengths: Sequence[int]) -> Tensors:
    """Row i's first lengths[i] values: views of one float32 copy of ``values`` (a copy per row cost more)."""
    copy = values.to(torch.float32, copy=True)
    return [copy[i, :n] for i, n in enumerate(lengths)]


def advantage_batch(samples: Sequence[Sample], rewards: Sequence[float], n_samples_per_prompt: int,
                    kl: Tensors | None = None, values: Tensors | None = None) -> AdvantageBatch:
    """Pad the step into the tensors an estimator takes."""
    if len(rewards) != len(samples):
        raise ValueError(f"{len(samples)} samples but {len(rewards)} rewards")
    masks = sample_masks(samples)
    lengths = [s.response_length for s in samples]
    width = max(lengths, default=0)
    group_id = torch.zeros(len(samples), dtype=torch.long)
    for g, members in enumerate(groups_of(samples, n_samples_per_prompt)):
        group_id[members] = g
    kl_rows = None
    if kl is not None:
        if len(kl) != len(masks) or any(k.numel() != m.numel() for k, m in zip(kl, masks, strict=True)):
            raise ValueError("kl needs one tensor per sample with one value per response token")
        kl_rows = pad_rows([k.detach().float() for k in kl], width)
    value_rows = None
    if values is not None:
        if len(values) != len(masks) or any(v.numel() != m.numel() for v, m in zip(values, masks, strict=True)):
            raise ValueError("values needs one tensor per sample with one value per response token")
        value_rows = pad_rows([v.detach().float() for v in values], width)
    return AdvantageBatch(torch.tensor([float(r) for r in rewards], dtype=torch.float64), pad_rows(masks, width),
                          torch.tensor(lengths, dtype=torch.long), group_id, kl_rows, n_samples_per_prompt,
                          valid=torch.tensor([not s.remove_sample for s in samples], dtype=torch.bool),
                          rollouts=torch.tensor(rollout_keys(samples), dtype=torch.long), values=value_rows)


# ---- built-in estimators: AdvantageBatch in, [B, T] advantages (and returns) out -------------------------------
def group_centre(rewards: torch.Tensor, groups: torch.Tensor, divide_by_std: bool, *,
                 valid: torch.Tensor | None = None, rollouts: torch.Tensor | None = None) -> torch.Tensor:
    """Subtract each group's mean; optionally divide by its unbiased std + 1e-6 (never for a group of one).

    The statistics count each rollout once (``rollouts``: an agent run's branches share its reward) and leave
    out removed samples (``valid`` False: a dead sandbox must not skew its siblings); removed samples get 0.
    All groups at once: a loop of small tensor ops per group cost a millisecond a step.
    """
    valid = torch.ones_like(groups, dtype=torch.bool) if valid is None else valid
    rollouts = torch.arange(len(groups)) if rollouts is None else rollouts
    _, gid = torch.unique(groups, return_inverse=True)  # group ids 0..G-1
    counted = torch.zeros_like(valid)  # the first valid position of each rollout of each group
    seen: set[tuple[int, int]] = set()
    for pos, (g, r, ok) in enumerate(zip(gid.tolist(), rollouts.tolist(), valid.tolist(), strict=True)):
        if ok and (g, r) not in seen:
            seen.add((g, r))
            counted[pos] = True
    n_groups = int(gid.max()) + 1 if len(gid) else 0
    stat_gid, stat_rewards = gid[counted], rewards[counted]

    def per_group(values: torch.Tensor) -> torch.Tensor:  # the sum of the counted values of each group
        return torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, stat_gid, values)

    count = per_group(torch.ones_like(stat_rewards))
    mean = per_group(stat_rewards) / count.clamp(min=1)
    centred = rewards - mean[gid]
    if divide_by_std:
        std = (per_group((stat_rewards - mean[stat_gid]) ** 2) / (count - 1).clamp(min=1)).sqrt()
        centred = centred / torch.where(count > 1, std + STD_EPS, 1.0)[gid]
    return torch.where(valid, centred, 0.0)


def _centre(batch: AdvantageBatch, divide_by_std: bool) -> torch.Tensor:
    return group_centre(batch.rewards, batch.groups, divide_by_std, valid=batch.valid, rollouts=batch.rollouts)


def _kl_or_zeros(batch: AdvantageBatch, kl_coef: float) -> torch.Tensor:
    if batch.kl is None:
        if kl_coef != 0.0:
            raise ValueError("trainer.kl_coef is non-zero: pass the per-token kl (policy vs reference)")
        return torch.zeros_like(batch.mask)
    return batch.kl


def grpo(batch: AdvantageBatch, cfg: TrainerConfig) -> torch.Tensor:
    """Group-relative: (r - group mean) / (group std + eps), the same value on every token of a response."""
    scores = _centre(batch, cfg.scale_by_std and batch.n_samples_per_prompt > 1)
    return scores.float().unsqueeze(-1).expand_as(batch.mask).clone()


def discounted_returns(token_rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t+1}, backwards over the last dimension (1-D or [B, T])."""
    out = torch.zeros_like(token_rewards)
    running = torch.zeros(token_rewards.shape[:-1], dtype=token_rewards.dtype)
    for t in range(token_rewards.shape[-1] - 1, -1, -1):
        running = token_rewards[..., t] + gamma * running
        out[..., t] = running
    return out


def token_rewards(batch: AdvantageBatch, cfg: TrainerConfig) -> torch.Tensor:
    """[B, T]: -kl_coef * kl on trainable tokens, plus the scalar reward on the last trainable token."""
    rewards = -cfg.kl_coef * _kl_or_zeros(batch, cfg.kl_coef) * batch.mask
    for i, n in enumerate(batch.lengths.tolist()):
        if n == 0:
            continue
        trainable = torch.nonzero(batch.mask[i, :n] > 0)
        last = int(trainable[-1]) if trainable.numel() else n - 1
        rewards[i, last] += float(batch.rewards[i])
    return rewards


def reinforce_plus_plus(batch: AdvantageBatch, cfg: TrainerConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Token reward -kl_coef*kl on trainable tokens, plus the scalar reward on the last trainable token, discounted."""
    returns = discounted_returns(token_rewards(batch, cfg), cfg.gamma)
    return returns.clone(), returns


def gae_from_values(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over [B, T] token rewards and values: (advantages, returns = A + V).

    delta_t = r_t + gamma * V_next - V_t and A_t = delta_t + gamma * lam * A_next, where "next" is the next
    trainable token (mask > 0): context tokens inside a response (tool output) are stepped over, as verl's
    multi-turn GAE does; past the last one V_next = 0. Masked positions get 0.
    """
    rewards, values, mask = rewards.double(), values.double() * mask, mask.double()
    advantages = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[:-1], dtype=torch.float64)
    next_value = torch.zeros_like(running)
    for t in range(rewards.shape[-1] - 1, -1, -1):
        live = mask[..., t] > 0
        delta = rewards[..., t] + gamma * next_value - values[..., t]
        step = delta + gamma * lam * running
        advantages[..., t] = torch.where(live, step, 0.0)
        running = torch.where(live, step, running)
        next_value = torch.where(live, values[..., t], next_value)
    return advantages.float(), ((advantages + values) * mask).float()


def gae(batch: AdvantageBatch, cfg: TrainerConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's advantages from the critic's values (trainer.critic): the reward (and -kl_coef * kl) as token
    rewards, then GAE with trainer.gamma and trainer.critic.lam; the returns are the critic's targets."""
    if batch.values is None:
        raise ValueError("advantage_estimator=gae needs the critic's values of every response token")
    return gae_from_values(token_rewards(batch, cfg), batch.values, batch.mask, cfg.gamma, cfg.critic.lam)


def reinforce_plus_plus_baseline(batch: AdvantageBatch, cfg: TrainerConfig) -> torch.Tensor:
    """(r - group mean) on every token, minus the per-token kl_coef * kl."""
    centred = _centre(batch, divide_by_std=False).float().unsqueeze(-1)
    return centred - cfg.kl_coef * _kl_or_zeros(batch, cfg.kl_coef) * batch.mask


# ---- the steps around the estimator -----------------------------------------------------------------------------
def estimate(samples: Sequence[Sample], rewards: Sequence[float], cfg: TrainerConfig, n_samples_per_prompt: int,
             kl: Tensors | None = None, values: Tensors | None = None) -> Advantages:
    """Step 1: the estimator's advantages (not yet whitened).

    ``rewards`` are the numeric training rewards, one per sample. ``kl`` (per token, policy vs reference,
    e.g. ``losses.kl_penalty(old_logp, ref_logp, "k1")``) is needed when reinforce++ uses kl_coef != 0.
    """
    batch = advantage_batch(samples, rewards, n_samples_per_prompt, kl, values)
    entry = get_advantage_estimator(cfg.advantage_estimator)
    out = entry.fn(batch, cfg)
    adv, returns = out if isinstance(out, tuple) else (out, out)
    for name, value in (("advantages", adv), ("returns", returns)):
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(batch.mask.shape):
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"advantage estimator {cfg.advantage_estimator!r} returned {name} of shape {got}, "
                             f"expected {tuple(batch.mask.shape)} (samples x longest response)")
    lengths = batch.lengths.tolist()
    return Advantages(unpad_rows(adv, lengths), unpad_rows(returns, lengths))


@overload
def apply_opd(advantages: torch.Tensor, student_logp: torch.Tensor, teacher_logp: torch.Tensor,
              coef: float) -> torch.Tensor: ...
@overload
def apply_opd(advantages: Tensors, student_logp: Tensors, teacher_logp: Tensors,
              coef: float | Sequence[float]) -> Tensors: ...
def apply_opd(advantages: Tensors | torch.Tensor, student_logp: Tensors | torch.Tensor,
              teacher_logp: Tensors | torch.Tensor, coef: float | Sequence[float]) -> Tensors | torch.Tensor:
    """Step 2 (on-policy distillation): advantages - coef * (student_logp - teacher_logp), per token.

    Accepts one tensor or a list of per-sample tensors (returns the same kind); with a list, ``coef`` may be one
    per sample (each sample's teacher has its own: config/teachers.py). No-op where coef == 0.
    """
    if isinstance(advantages, torch.Tensor):
        assert isinstance(coef, int | float), "one tensor takes one coefficient"
        if coef == 0.0:
            return advantages
        student, teacher = torch.as_tensor(student_logp), torch.as_tensor(teacher_logp)
        return advantages - coef * (student.detach().float() - teacher.detach().float())
    coefs = [float(coef)] * len(advantages) if isinstance(coef, int | float) else [float(c) for c in coef]
    if not any(coefs):
        return list(advantages)
    if not (len(advantages) == len(student_logp) == len(teacher_logp) == len(coefs)):
        raise ValueError("advantages, student_logp, teacher_logp and the coefficients need one entry per sample")
    return [a if c == 0.0 else a - c * (torch.as_tensor(s, dtype=torch.float32).reshape(-1) -
                                        torch.as_tensor(t, dtype=torch.float32).reshape(-1))
            for a, s, t, c in zip(advantages, student_logp, teacher_logp, coefs, strict=True)]


AllReduce = Callable[[torch.Tensor], torch.Tensor]


def whiten_stats(advantages: Tensors, masks: Tensors) -> torch.Tensor:
    """[sum, sum of squares, count] over valid tokens (float64), the quantities ranks add up."""
    stats = torch.zeros(3, dtype=torch.float64)
    for a, m in zip(advantages, masks, strict=True):
        a64, m64 = a.detach().double(), (m > 0).double()
        stats += torch.stack([(a64 * m64).sum(), (a64 * a64 * m64).sum(), m64.sum()])
    return stats


def whiten(advantages: Tensors, masks: Tensors, all_reduce: AllReduce | None = None) -> Tensors:
    """(A - mean) / sqrt(var + 1e-8) with mean and (population) variance over valid tokens only.

    Masked positions become 0. With data parallelism pass ``all_reduce`` (sums a float64 tensor
    [sum, sum_sq, count] over ranks) so the statistics span the global batch.
    """
    stats = whiten_stats(advantages, masks)
    if all_reduce is not None:
        stats = all_reduce(stats)
    total, total_sq, count = stats.tolist()
    if count == 0:
        return [torch.zeros_like(a) for a in advantages]
    mean = total / count
    var = max(total_sq / count - mean * mean, 0.0)
    scale = 1.0 / (var + WHITEN_EPS) ** 0.5
    return [((a - mean) * scale * (m > 0)).to(torch.float32) for a, m in zip(advantages, masks, strict=True)]


def finalize(advantages: Tensors, samples: Sequence[Sample], cfg: TrainerConfig,
             all_reduce: AllReduce | None = None) -> Tensors:
    """Step 3: whiten for the estimators registered with whiten=True (the reinforce++ ones); others pass through."""
    entry = get_advantage_estimator(cfg.advantage_estimator)
    if entry.options.get("whiten", False):
        return whiten(advantages, sample_masks(samples), all_reduce)
    return list(advantages)


def teacher_log_probs(samples: Sequence[Sample]) -> Tensors:
    """The teacher's per-token log-probs of every sample; a sample without them is an error, never zeros."""
    out = []
    for i, s in enumerate(samples):
        if s.teacher_log_probs is None or len(s.teacher_log_probs) != s.response_length:
            got = "none" if s.teacher_log_probs is None else f"{len(s.teacher_log_probs)} values"
            raise ValueError(f"sample {i} (index {s.index}) has no teacher log-probs for its {s.response_length} "
                             f"response tokens (got {got}): trainer.opd_kl_coef > 0 needs teacher_log_probs "
                             "on every sample")
        out.append(torch.tensor(s.teacher_log_probs, dtype=torch.float32))
    return out


def compute_advantages(samples: Sequence[Sample], rewards: Sequence[float], cfg: TrainerConfig,
                       n_samples_per_prompt: int, *, kl: Tensors | None = None,
                       student_logp: Tensors | None = None, teacher_logp: Tensors | None = None,
                       all_reduce: AllReduce | None = None, values: Tensors | None = None,
                       opd_coefs: Sequence[float] | None = None) -> Advantages:
    """estimate -> x trainer.reward_coef -> apply_opd (where a sample's OPD coefficient > 0) -> finalize, in that
    order.

    ``values``: the critic's per-token values, for an estimator registered with critic=True (gae). ``opd_coefs``:
    each sample's OPD coefficient (its teacher's opd_kl_coef); None: trainer.opd_kl_coef for all."""
    out = estimate(samples, rewards, cfg, n_samples_per_prompt, kl, values)
    # trainer.reward_coef scales the task-reward part after the estimator (a group std would cancel it before)
    adv = out.advantages if cfg.reward_coef == 1.0 else [a * cfg.reward_coef for a in out.advantages]
    coefs = [cfg.opd_kl_coef] * len(samples) if opd_coefs is None else list(opd_coefs)
    if any(coefs):
        if student_logp is None:
            raise ValueError("trainer.opd_kl_coef > 0 needs the student's log-probs")
        if teacher_logp is None:
            teacher_logp = teacher_log_probs(samples)
        adv = apply_opd(adv, student_logp, teacher_logp, coefs)
    return Advantages(finalize(adv, samples, cfg, all_reduce), out.returns)
