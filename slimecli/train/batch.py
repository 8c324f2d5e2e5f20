"""Pack samples into padded tensors whose per-token fields line up with the response tokens.

Every per-token tensor has shape [B, R] (R = longest response in the micro-batch): column j of
row i is response token j of sample i; `mask` is the loss mask (0 for padding, context tokens
and removed samples).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slimecli.rollout.sample import Sample


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # [B, L] right-padded prompt + response tokens
    attention_mask: torch.Tensor  # [B, L]
    logit_index: torch.Tensor  # [B, R] position whose logits predict response token j
    targets: torch.Tensor  # [B, R] the response token ids
    mask: torch.Tensor  # [B, R] float loss mask
    rollout_log_probs: torch.Tensor  # [B, R] engine log-probs (zeros where unknown)

    def to(self, device: torch.device) -> PackedBatch:
        return PackedBatch(**{k: v.to(device) for k, v in self.__dict__.items()})


def pack(samples: list[Sample], pad_id: int) -> PackedBatch:
    lengths = [len(s.tokens) for s in samples]
    r_max = max(max(s.response_length for s in samples), 1)
    b, l_max = len(samples), max(lengths)
    input_ids = torch.full((b, l_max), pad_id, dtype=torch.long)
    attention = torch.zeros((b, l_max), dtype=torch.long)
    logit_index = torch.zeros((b, r_max), dtype=torch.long)
    targets = torch.full((b, r_max), pad_id, dtype=torch.long)
    mask = torch.zeros((b, r_max), dtype=torch.float32)
    rollout_lp = torch.zeros((b, r_max), dtype=torch.float32)
    for i, s in enumerate(samples):
        n, r = len(s.tokens), s.response_length
        if r >= n:
            raise ValueError(f"sample {s.index}: response_length {r} leaves no prompt token in {n} tokens")
        input_ids[i, :n] = torch.tensor(s.tokens, dtype=torch.long)
        attention[i, :n] = 1
        start = n - r
        logit_index[i, :r] = torch.arange(start - 1, n - 1)
        logit_index[i, r:] = n - 1  # padding columns point at a real position; masked out
        targets[i, :r] = torch.tensor(s.tokens[start:], dtype=torch.long)
        mask[i, :r] = torch.tensor(s.effective_loss_mask(), dtype=torch.float32)
        if s.rollout_log_probs is not None:
            rollout_lp[i, :r] = torch.tensor(s.rollout_log_probs, dtype=torch.float32)
    return PackedBatch(input_ids, attention, logit_index, targets, mask, rollout_lp)
