"""Differentiable log-probs and entropy from vocab-parallel logits, without gathering the vocabulary.

Each tensor-parallel rank holds logits for its slice of the vocabulary [..., V/tp]. The softmax normaliser and
the target's logit are sums over slices: an all-reduce whose backward is the identity (megatron-core's
``reduce_from_tensor_model_parallel_region``), so each rank's gradient flows into its own slice. The same
technique as the teacher server, here with gradients. Columns past the real vocabulary (padding to a multiple
of tp) are masked out.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _reduce(t: torch.Tensor) -> torch.Tensor:
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    out: torch.Tensor = reduce_from_tensor_model_parallel_region(t)
    return out


def _tp() -> tuple[int, int, dist.ProcessGroup | None]:
    from megatron.core import parallel_state as ps

    return ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size(), \
        ps.get_tensor_model_parallel_group()


def log_probs_and_entropy(local: torch.Tensor, targets: torch.Tensor, vocab_size: int, temperature: float, *,
                          with_entropy: bool, entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """local [..., V/tp] logits, targets [...] token ids -> log softmax(logits / T)[target] [...] (and entropy)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    rank, size, group = _tp()
    width = local.shape[-1]
    start = rank * width
    z = local.float() / temperature
    if start + width > vocab_size:  # this slice holds padding columns
        pad = torch.arange(start, start + width, device=z.device) >= vocab_size
        z = z.masked_fill(pad, torch.finfo(z.dtype).min)
    m = z.detach().amax(dim=-1, keepdim=True)
    if size > 1:
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    e = torch.exp(z - m)
    sum_e = _reduce(e.sum(dim=-1, keepdim=True))
    log_z = m + torch.log(sum_e)
    index = targets.long() - start
    inside = (index >= 0) & (index < width)
    picked = z.gather(-1, index.clamp(0, width - 1).unsqueeze(-1)).squeeze(-1) * inside
    logp = _reduce(picked) - log_z.squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.enable_grad() if entropy_grad else torch.no_grad():
            zz, ee, ss, lz = (z, e, sum_e, log_z) if entropy_grad else (z.detach(), e.detach(), sum_e.detach(),
                                                                        log_z.detach())
            expected = _reduce((ee / ss * zz).sum(dim=-1, keepdim=True))
            entropy = (lz - expected).squeeze(-1)
    return logp, entropy
