"""Off-policy corrections (trainer.off_policy_correction): importance weights between the policy that sampled the
tokens (the engine's per-token log-probs, each from the weight version that sampled it) and the trainer's old
policy (recomputed), which multiply the per-token policy-gradient loss.

A correction is ``fn(old_logp, behaviour_logp, mask, cfg) -> Correction``, all [B, T], tensors in and out
(registered like the policy losses: OFF_POLICY_CORRECTIONS, built-ins declared in train/plugins.py):

- ``tis``: truncated importance sampling, the ratio clamped to [tis_clip_low, tis_clip_high];
- ``mis``: masked importance sampling by sequence: a sequence whose geometric-mean ratio lies outside
  [is_mask_low, is_mask_high] is left out whole, the others weighted by their tokens' ratios;
- ``icepop``: the same mask token by token (IcePop's double-sided mask);
- ``decoupled_ppo``: AReaL's decoupled objective: the recomputed log-probs are the proximal policy the PPO clip
  is taken against, and the behaviour weight (proximal over behaviour) multiplies the loss; tokens whose weight is
  above is_mask_high are left out.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from slimecli.config.groups.trainer import TrainerConfig


class Correction(NamedTuple):
    weights: torch.Tensor  # [B, T], constants: the per-token loss is multiplied by them
    clipped: torch.Tensor  # [B, T] bool: tokens whose weight was truncated
    masked: torch.Tensor  # [B, T] bool: tokens left out (weight 0)


def ratio(old_logp: torch.Tensor, behaviour_logp: torch.Tensor) -> torch.Tensor:
    return torch.exp(old_logp.detach().float() - behaviour_logp.detach().float())


def tis(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor, cfg: TrainerConfig) -> Correction:
    raw = ratio(old_logp, behaviour_logp)
    weights = raw.clamp(cfg.tis_clip_low, cfg.tis_clip_high)
    return Correction(weights, (weights != raw) & (mask > 0), torch.zeros_like(mask, dtype=torch.bool))


def mis(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor, cfg: TrainerConfig) -> Correction:
    raw = ratio(old_logp, behaviour_logp)
    m = mask.float()
    log_gap = ((old_logp.detach().float() - behaviour_logp.detach().float()) * m).sum(-1) / m.sum(-1).clamp(min=1)
    seq_ratio = torch.exp(log_gap)
    out = ((seq_ratio < cfg.is_mask_low) | (seq_ratio > cfg.is_mask_high))[:, None].expand_as(raw) & (mask > 0)
    return Correction(torch.where(out, torch.zeros_like(raw), raw), torch.zeros_like(out), out)


def icepop(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor,
           cfg: TrainerConfig) -> Correction:
    raw = ratio(old_logp, behaviour_logp)
    out = ((raw < cfg.is_mask_low) | (raw > cfg.is_mask_high)) & (mask > 0)
    return Correction(torch.where(out, torch.zeros_like(raw), raw), torch.zeros_like(out), out)


def decoupled_ppo(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor,
                  cfg: TrainerConfig) -> Correction:
    raw = ratio(old_logp, behaviour_logp)
    out = (raw > cfg.is_mask_high) & (mask > 0)
    return Correction(torch.where(out, torch.zeros_like(raw), raw), torch.zeros_like(out), out)


def mismatch_kl(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL(engine || trainer) per token, k3's unbiased low-variance estimate over the engine's samples, averaged
    over the masked tokens: how far the engine's sampling policy is from the trainer's."""
    log_r = old_logp.detach().float() - behaviour_logp.detach().float()
    k3 = torch.exp(log_r) - 1 - log_r
    m = mask.float()
    return (k3 * m).sum() / m.sum().clamp(min=1)
