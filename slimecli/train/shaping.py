"""Reward shaping before the advantages: DAPO's soft overlong punishment (trainer.overlong_buffer).

A response cut at rollout.max_new_tokens has no answer to grade, and an answer that only just fits is as likely
truncated reasoning; DAPO (arXiv:2503.14476, section 3.4) adds a length penalty that falls linearly over the last
``overlong_buffer`` tokens of the budget, so the policy learns to finish early without a cliff at the cap.
The logged task reward (reward/*) stays the unshaped one; the advantages see reward + penalty.
"""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, factor: float) -> torch.Tensor:
    """Per-sample penalty [B] (<= 0) for response lengths [B]: 0 up to max_len - buffer tokens, then
    -factor * (length - (max_len - buffer)) / buffer, reaching -factor at max_len (and staying there beyond)."""
    if buffer <= 0 or buffer > max_len:
        raise ValueError(f"overlong buffer must be in 1..{max_len} tokens, got {buffer}")
    over = (lengths.double() - (max_len - buffer)).clamp(min=0.0)
    return -factor * (over / buffer).clamp(max=1.0)


def shape_rewards(rewards: list[float], lengths: list[int], max_len: int, buffer: int, factor: float
                  ) -> tuple[list[float], dict[str, float]]:
    """The rewards with the overlong penalty added, and its metrics: reward/overlong_penalty_mean (over the
    samples) and reward/overlong_frac (the share of samples it touched)."""
    if buffer == 0 or not rewards:
        return list(rewards), {}
    penalty = overlong_penalty(torch.tensor(lengths), max_len, buffer, factor)
    shaped = (torch.tensor(rewards, dtype=torch.float64) + penalty).tolist()
    return shaped, {"reward/overlong_penalty_mean": float(penalty.mean()),
                    "reward/overlong_frac": float((penalty < 0).double().mean())}
