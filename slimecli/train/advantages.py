"""Per-token advantages and returns from a batch of Samples and their numeric rewards.

The trainer calls, in this order (``compute_advantages`` does all three):
  1. ``estimate(...)``         the configured estimator (grpo, gspo, reinforce_plus_plus[_baseline])
  2. ``apply_opd(...)``        on-policy distillation: advantages -= coef * (student - teacher)
  3. ``finalize(...)``         whitening over the batch's valid tokens, for the estimators that whiten

Every per-sample quantity is a list with one 1-D float tensor per sample of length ``response_length``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from slimecli.config.groups.trainer import TrainerConfig
from slimecli.rollout.sample import Sample

STD_EPS = 1e-6  # grpo: reward / (unbiased std + STD_EPS)
WHITEN_EPS = 1e-8  # whitening: (A - mean) / sqrt(var + WHITEN_EPS)
WHITENED_ESTIMATORS = ("reinforce_plus_plus", "reinforce_plus_plus_baseline")

Tensors = list[torch.Tensor]


@dataclass
class Advantages:
    advantages: Tensors  # what the policy loss multiplies
    returns: Tensors  # reward-to-go before any OPD term or whitening (logged, and kept for a future critic)


def sample_masks(samples: Sequence[Sample]) -> Tensors:
    """Loss masks as float tensors; remove_sample gives all zeros (the sample stays in the batch)."""
    return [torch.tensor(s.effective_loss_mask(), dtype=torch.float32) for s in samples]


def groups_of(samples: Sequence[Sample], n_samples_per_prompt: int) -> list[list[int]]:
    """Batch positions grouped by prompt.

    Groups are the samples sharing a ``group_index``; when those groups are not all of size n (agent
    fan-out, or group_index left unset) the whole batch is one group, as the reference does.
    """
    by_group: dict[int, list[int]] = {}
    for i, s in enumerate(samples):
        by_group.setdefault(s.group_index, []).append(i)
    groups = list(by_group.values())
    if all(len(g) == n_samples_per_prompt for g in groups):
        return groups
    return [list(range(len(samples)))]


def group_normalize(rewards: Sequence[float], groups: list[list[int]], divide_by_std: bool) -> list[float]:
    """Subtract each group's mean; optionally divide by its unbiased std + 1e-6 (never for a group of one)."""
    values = torch.tensor([float(r) for r in rewards], dtype=torch.float64)
    out = values.clone()
    for g in groups:
        idx = torch.tensor(g, dtype=torch.long)
        centred = values[idx] - values[idx].mean()
        if divide_by_std and len(g) > 1:
            centred = centred / (values[idx].std(unbiased=True) + STD_EPS)
        out[idx] = centred
    return out.tolist()


def _kl_or_zeros(kl: Tensors | None, masks: Tensors, kl_coef: float) -> Tensors:
    if kl is None:
        if kl_coef != 0.0:
            raise ValueError("trainer.kl_coef is non-zero: pass the per-token kl (policy vs reference)")
        return [torch.zeros_like(m) for m in masks]
    if len(kl) != len(masks) or any(k.numel() != m.numel() for k, m in zip(kl, masks, strict=True)):
        raise ValueError("kl needs one tensor per sample with one value per response token")
    return [k.detach().float().reshape(-1) for k in kl]


def discounted_returns(token_rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t+1}, backwards over the response."""
    out = torch.zeros_like(token_rewards)
    running = torch.zeros((), dtype=token_rewards.dtype)
    for t in range(token_rewards.numel() - 1, -1, -1):
        running = token_rewards[t] + gamma * running
        out[t] = running
    return out


def reinforce_plus_plus_returns(rewards: Sequence[float], kl: Tensors, masks: Tensors, kl_coef: float,
                                gamma: float) -> Tensors:
    """Token reward -kl_coef*kl on trainable tokens, plus the scalar reward on the last trainable token."""
    out = []
    for r, k, m in zip(rewards, kl, masks, strict=True):
        token_rewards = -kl_coef * k * m
        if token_rewards.numel():
            trainable = torch.nonzero(m > 0)
            last = int(trainable[-1]) if trainable.numel() else token_rewards.numel() - 1
            token_rewards[last] += float(r)
        out.append(discounted_returns(token_rewards, gamma))
    return out


def estimate(samples: Sequence[Sample], rewards: Sequence[float], cfg: TrainerConfig, n_samples_per_prompt: int,
             kl: Tensors | None = None) -> Advantages:
    """Step 1: the estimator's advantages (not yet whitened).

    ``rewards`` are the numeric training rewards, one per sample. ``kl`` (per token, policy vs reference,
    e.g. ``losses.kl_penalty(old_logp, ref_logp, "k1")``) is needed when reinforce++ uses kl_coef != 0.
    """
    if len(rewards) != len(samples):
        raise ValueError(f"{len(samples)} samples but {len(rewards)} rewards")
    masks = sample_masks(samples)
    est = cfg.advantage_estimator
    if est in ("grpo", "gspo"):
        groups = groups_of(samples, n_samples_per_prompt)
        scores = group_normalize(rewards, groups, cfg.normalize_std and n_samples_per_prompt > 1)
        adv = [torch.full_like(m, s) for s, m in zip(scores, masks, strict=True)]
        return Advantages(adv, [a.clone() for a in adv])
    if est == "reinforce_plus_plus":
        returns = reinforce_plus_plus_returns(rewards, _kl_or_zeros(kl, masks, cfg.kl_coef), masks, cfg.kl_coef,
                                              cfg.gamma)
        return Advantages([r.clone() for r in returns], returns)
    if est == "reinforce_plus_plus_baseline":
        centred = group_normalize(rewards, groups_of(samples, n_samples_per_prompt), divide_by_std=False)
        kls = _kl_or_zeros(kl, masks, cfg.kl_coef)
        adv = [torch.full_like(m, s) - cfg.kl_coef * k * m for s, k, m in zip(centred, kls, masks, strict=True)]
        return Advantages(adv, [a.clone() for a in adv])
    raise ValueError(f"unknown advantage estimator {est!r}")


def apply_opd(advantages: Tensors | torch.Tensor, student_logp: Tensors | torch.Tensor,
              teacher_logp: Tensors | torch.Tensor, coef: float) -> Tensors | torch.Tensor:
    """Step 2 (on-policy distillation): advantages - coef * (student_logp - teacher_logp), per token.

    Accepts one tensor or a list of per-sample tensors (returns the same kind). No-op when coef == 0.
    """
    if isinstance(advantages, torch.Tensor):
        if coef == 0.0:
            return advantages
        return advantages - coef * (student_logp.detach().float() - teacher_logp.detach().float())
    if coef == 0.0:
        return list(advantages)
    if not (len(advantages) == len(student_logp) == len(teacher_logp)):
        raise ValueError("advantages, student_logp and teacher_logp need one entry per sample")
    return [a - coef * (torch.as_tensor(s, dtype=torch.float32).reshape(-1) -
                        torch.as_tensor(t, dtype=torch.float32).reshape(-1))
            for a, s, t in zip(advantages, student_logp, teacher_logp, strict=True)]


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
    """Step 3: whiten for the reinforce++ estimators; grpo/gspo advantages pass through unchanged."""
    if cfg.advantage_estimator in WHITENED_ESTIMATORS:
        return whiten(advantages, sample_masks(samples), all_reduce)
    return list(advantages)


def compute_advantages(samples: Sequence[Sample], rewards: Sequence[float], cfg: TrainerConfig,
                       n_samples_per_prompt: int, *, kl: Tensors | None = None,
                       student_logp: Tensors | None = None, teacher_logp: Tensors | None = None,
                       all_reduce: AllReduce | None = None) -> Advantages:
    """estimate -> x trainer.reward_coef -> apply_opd (when trainer.opd_kl_coef > 0) -> finalize, in that order."""
    out = estimate(samples, rewards, cfg, n_samples_per_prompt, kl)
    # trainer.reward_coef scales the task-reward part after the estimator (a group std would cancel it before)
    adv = out.advantages if cfg.reward_coef == 1.0 else [a * cfg.reward_coef for a in out.advantages]
    if cfg.opd_kl_coef:
        if student_logp is None:
            raise ValueError("trainer.opd_kl_coef > 0 needs the student's log-probs")
        if teacher_logp is None:
            if any(s.teacher_log_probs is None for s in samples):
                raise ValueError("trainer.opd_kl_coef > 0 needs teacher_log_probs on every sample")
            teacher_logp = [torch.tensor(s.teacher_log_probs, dtype=torch.float32) for s in samples]
        adv = apply_opd(adv, student_logp, teacher_logp, cfg.opd_kl_coef)
    return Advantages(finalize(adv, samples, cfg, all_reduce), out.returns)
