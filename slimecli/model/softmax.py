"""Softmax in base 2, for the trainer's log-probs and the engine's sampler.

On a CPU, torch's ``exp`` goes to a vector-math library call that costs twice ``exp2`` (and about ten times
where the softmax's small values are subnormal floats); ``exp2`` of logits scaled by log2(e) is the same
function. Both callers keep the log2 weights: a log-prob is ``log2_w * LN2 - log(sum of weights)``.
"""

from __future__ import annotations

import math

import torch

LOG2E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)


def log2_weights(x: torch.Tensor, inv_t: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """log2 of softmax(x / T)'s unnormalised weights, a new [N, V] tensor with each row's top at exactly 0
    (so its exp2 cannot overflow and the top token's log-prob is <= 0), and the rows' maxima of x [N, 1]."""
    top = x.amax(-1, keepdim=True)
    return torch.sub(x, top).mul_(inv_t * LOG2E), top
