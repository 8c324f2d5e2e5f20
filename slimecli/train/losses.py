"""Policy-gradient loss pieces: log-probs at a temperature, entropy, PPO clip, CISPO, GSPO ratio, KL, TIS, reduction.

``policy_loss`` wraps the registered per-token policy loss (trainer.policy_loss, built-in ``ppo_clip``) with
the importance ratio (trainer.importance_level), TIS, the reduction, entropy and KL terms.

Layout: per-token tensors of one shape (typically [B, T], right-padded responses). ``weights`` from
``loss_weights`` carry both the loss mask and the reduction, so every loss and metric here is a plain
weighted sum: summing it over the micro-batches (and ranks) of a step gives the step's value.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from slimecli.config.groups.trainer import TrainerConfig
from slimecli.model.softmax import LN2, log2_weights
from slimecli.rollout.sample import Sample
from slimecli.train.registry import get_policy_loss

LOW_VAR_KL_CLAMP = 10.0


def _chunks(logits: torch.Tensor, temperature: float, chunk_size: int) -> Iterator[tuple[slice, torch.Tensor]]:
    """logits [..., V] as float32 rows, ``chunk_size`` rows at a time (never a second full [N, V] tensor)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    rows = logits.reshape(-1, logits.shape[-1])
    if rows.shape[0] <= chunk_size:  # whole: a slice's backward would zero-fill and copy a full [N, V] gradient
        yield slice(None), rows.float()
        return
    for start in range(0, rows.shape[0], chunk_size):
        yield slice(start, start + chunk_size), rows[start:start + chunk_size].float()


def _joined(parts: list[torch.Tensor], shape: torch.Size, like: torch.Tensor) -> torch.Tensor:
    """The chunks' per-row values as one float32 tensor of ``shape`` (on ``like``'s device when there are none)."""
    return (torch.cat(parts) if parts else like.new_zeros(0, dtype=torch.float32)).reshape(shape)


def _softmax_parts(x: torch.Tensor, inv_t: float, targets: torch.Tensor | None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """softmax(x / T) [N, V], its log-normaliser [N] and the targets' log-probs [N] (when given), from one
    pass over x [N, V] that writes a new tensor and one exp2 over that."""
    z, top = log2_weights(x, inv_t)
    picked = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) if targets is not None else None
    probs = z.exp2_()
    total = probs.sum(-1, keepdim=True)
    log_total = total.log().squeeze(-1)
    probs.div_(total)
    lse = top.squeeze(-1) * inv_t + log_total
    return probs, lse, picked * LN2 - log_total if picked is not None else None


class _TokenLogProbs(torch.autograd.Function):
    """log softmax(x / T)[target] and the entropy of softmax(x / T) for rows x [N, V].

    Autograd through logsumexp, gather and a softmax sweeps and allocates several [N, V] tensors (for
    [256, 4096] on one CPU thread, 8 ms of a small model's step). Here the forward makes one [N, V] tensor,
    the softmax, and keeps it instead of x (the same size); the backward scales it by each row's weight.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, targets: torch.Tensor, inv_t: float, entropy_grad: bool
                ) -> tuple[torch.Tensor, torch.Tensor]:
        probs, lse, logp = _softmax_parts(x, inv_t, targets)
        entropy = lse - torch.linalg.vecdot(probs, x) * inv_t  # H = lse - sum p * x / T
        # an entropy bonus's gradient needs log p, which the softmax alone loses where it underflows
        ctx.save_for_backward(probs, targets, entropy, x if entropy_grad else None, lse if entropy_grad else None)
        ctx.inv_t = inv_t
        ctx.set_materialize_grads(False)
        assert logp is not None  # targets were given
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, grad_logp: torch.Tensor | None, grad_entropy: torch.Tensor | None
                 ) -> tuple[torch.Tensor | None, None, None, None]:
        # z = x / T:  d logp_t / dz = onehot(t) - p;  dH / dz = -p (log p + H)
        probs, targets, entropy, x, lse = ctx.saved_tensors
        inv_t = ctx.inv_t
        g = grad_logp if grad_logp is not None else torch.zeros_like(entropy)
        weight = g.unsqueeze(-1) * -inv_t
        if grad_entropy is not None:
            if x is None:
                raise RuntimeError("the entropy was computed as a metric (entropy_grad=False): it has no gradient")
            log_p = torch.add((entropy - lse).unsqueeze(-1), x, alpha=inv_t)  # log p + H
            weight = log_p.mul_(grad_entropy.unsqueeze(-1) * -inv_t).add_(weight)
        grad = probs * weight
        grad.scatter_add_(-1, targets.unsqueeze(-1), g.unsqueeze(-1) * inv_t)
        return grad, None, None, None


def log_probs_from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                          chunk_size: int = 4096) -> torch.Tensor:
    """log softmax(logits / T)[target] for every position, without keeping a full [N, V] log-softmax.

    logits [..., V], targets [...] -> [...] (float32). Rows are processed in chunks of ``chunk_size``.
    """
    return log_probs_and_entropy(logits, targets, temperature, chunk_size=chunk_size)[0]


def log_probs_and_entropy(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, *,
                          entropy_grad: bool = False, chunk_size: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """log_probs_from_logits and entropy_from_logits in one pass over each chunk.

    The entropy is in the graph only with ``entropy_grad`` (an entropy bonus); otherwise it is a metric.
    """
    flat_targets = targets.reshape(-1).long()
    logps, entropies = [], []
    for rows, chunk in _chunks(logits, temperature, chunk_size):
        logp, entropy = _TokenLogProbs.apply(chunk, flat_targets[rows], 1.0 / temperature, entropy_grad)  # type: ignore[no-untyped-call]  # unannotated in torch
        logps.append(logp)
        entropies.append(entropy if entropy_grad else entropy.detach())
    return _joined(logps, targets.shape, logits), _joined(entropies, logits.shape[:-1], logits)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0, chunk_size: int = 4096) -> torch.Tensor:
    """Entropy of softmax(logits / T) per position: logits [..., V] -> [...] (float32)."""
    out = []
    for _, chunk in _chunks(logits, temperature, chunk_size):
        probs, lse, _ = _softmax_parts(chunk, 1.0 / temperature, None)
        out.append(lse - torch.linalg.vecdot(probs, chunk) / temperature)
    return _joined(out, logits.shape[:-1], logits)


def pad_sequences(seqs: Sequence[torch.Tensor | Sequence[float]], value: float = 0.0,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Right-pad 1-D sequences into [B, max_len]."""
    tensors = [torch.as_tensor(s, dtype=dtype).reshape(-1) for s in seqs]
    width = max((t.numel() for t in tensors), default=0)
    out = torch.full((len(tensors), width), value, dtype=dtype)
    for i, t in enumerate(tensors):
        out[i, :t.numel()] = t
    return out


def loss_weights(samples: Sequence[Sample], reduction: str = "per_rollout", *,
                 norm_tokens: int | None = None) -> list[torch.Tensor]:
    """Per-token reduction weights for every sample of one optimizer step (computed once for the whole step).

    per_rollout: mask / (total mask of the token's rollout) / (number of rollouts in the step); samples
    sharing a ``rollout_id`` are one rollout, a sample without one is its own. Rollouts whose mask is all
    zero (remove_sample, aborted) still count in the number of rollouts: they stay in the batch.
    per_token: mask / (total mask of the step).
    token_sum_norm (Dr. GRPO, verl's seq-mean-token-sum-norm): mask / norm_tokens / (number of rollouts): every
    token weighs the same whatever its response's length, and the step's scale does not depend on the lengths.
    """
    masks = [torch.tensor(s.effective_loss_mask(), dtype=torch.float32) for s in samples]
    if reduction == "per_token":
        total = max(float(sum(m.sum() for m in masks)), 1.0)
        return [m / total for m in masks]
    if reduction not in ("per_rollout", "token_sum_norm"):
        raise ValueError(f"unknown loss reduction {reduction!r}")
    keys = [("rollout", s.rollout_id) if s.rollout_id is not None else ("sample", i) for i, s in enumerate(samples)]
    totals: dict[tuple[str, int], float] = {}
    for key, m in zip(keys, masks, strict=True):
        totals[key] = totals.get(key, 0.0) + float(m.sum())
    n_rollouts = max(len(totals), 1)
    if reduction == "token_sum_norm":
        if norm_tokens is None or norm_tokens <= 0:
            raise ValueError(f"loss reduction token_sum_norm needs a positive token count, got {norm_tokens}")
        return [m / norm_tokens / n_rollouts for m in masks]
    return [m / max(totals[key], 1.0) / n_rollouts for key, m in zip(keys, masks, strict=True)]


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate with lr = logp - ref_logp: k1 = lr, k2 = lr^2/2, low_var_kl = e^-lr - 1 + lr."""
    lr = logp.float() - ref_logp.float()
    if kind == "k1":
        return lr
    if kind == "k2":
        return lr * lr / 2
    if kind in ("low_var_kl", "k3"):
        return (torch.exp(-lr) - 1 + lr).clamp(-LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP)
    raise ValueError(f"unknown kl type {kind!r}")


def gspo_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sequence-level log ratio (GSPO, trainer.importance_level=sequence): each row's masked mean of
    (logp - old), broadcast over the row ([B, T])."""
    m = mask.float()
    seq = ((logp - old_logp) * m).sum(-1) / m.sum(-1).clamp_min(1.0)
    return seq.unsqueeze(-1).expand_as(logp)


def ppo_clip_loss(log_ratio: torch.Tensor, advantages: torch.Tensor, eps_clip: float,
                  eps_clip_high: float | None = None, eps_clip_c: float | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token clipped surrogate: max(-r*A, -clip(r, 1-eps, 1+eps_high)*A).

    Dual clip (c > 1): for A < 0 the loss is also capped at -c*A. Returns (loss, clipped, dual_clipped)
    where the last two are 0/1 indicators per token.
    """
    high = eps_clip if eps_clip_high is None else eps_clip_high
    ratio = torch.exp(log_ratio)
    loss1 = -advantages * ratio
    loss2 = -advantages * ratio.clamp(1.0 - eps_clip, 1.0 + high)
    loss = torch.maximum(loss1, loss2)
    clipped = (loss2 > loss1).float()
    dual = torch.zeros_like(clipped)
    if eps_clip_c is not None:
        if not eps_clip_c > 1.0:
            raise ValueError(f"dual clip constant must be > 1, got {eps_clip_c}")
        cap = -advantages * eps_clip_c
        negative = advantages < 0
        dual = (negative & (loss > cap)).float()
        loss = torch.where(negative, torch.minimum(loss, cap), loss)
    return loss, clipped, dual


def ppo_clip(log_ratio: torch.Tensor, advantages: torch.Tensor, cfg: TrainerConfig
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate (dual clip with trainer.eps_clip_c), with its clip indicators as metrics."""
    loss, clipped, dual = ppo_clip_loss(log_ratio, advantages, cfg.eps_clip, cfg.eps_clip_high, cfg.eps_clip_c)
    metrics = {"pg_clipfrac": clipped}
    if cfg.eps_clip_c is not None:
        metrics["pg_dual_clipfrac"] = dual
    return loss, metrics


def cispo_loss(log_ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO (MiniMax-M1): -sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * log pi, per token.

    The importance weight is clipped, never the token: every token keeps its gradient, weighted by the
    detached clipped weight. Written as -A * w * exp(lr - sg(lr)): its value is -w * A (PPO's scale, so
    pg_loss reads the same) and its gradient -w * A * grad log pi. Returns (loss, clipped indicator).
    """
    ratio = torch.exp(log_ratio.detach())
    weight = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = -advantages * weight * torch.exp(log_ratio - log_ratio.detach())
    return loss, (weight != ratio).float()


def cispo(log_ratio: torch.Tensor, advantages: torch.Tensor, cfg: TrainerConfig
          ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """trainer.policy_loss=cispo, with the share of tokens whose weight was clipped as pg_clipfrac."""
    loss, clipped = cispo_loss(log_ratio, advantages, cfg.cispo_eps_low, cfg.cispo_eps_high)
    return loss, {"pg_clipfrac": clipped}


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float | None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's critic loss per token: 0.5 * max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2).

    With clip None, 0.5 * (V - R)^2. Returns (loss, clipped indicator): 1 where the clipped term was larger.
    """
    unclipped = (values - returns) ** 2
    if clip is None:
        return 0.5 * unclipped, torch.zeros_like(unclipped)
    old = old_values.detach()
    clipped = (old + (values - old).clamp(-clip, clip) - returns) ** 2
    return 0.5 * torch.maximum(unclipped, clipped), (clipped > unclipped).float()


def reduce(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted sum with ``loss_weights`` (so the per-step loss is a sum over micro-batches)."""
    return (values * weights).sum()


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, weights: torch.Tensor,
                cfg: TrainerConfig, *, mask: torch.Tensor | None = None, entropy: torch.Tensor | None = None,
                ref_logp: torch.Tensor | None = None, is_weights: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """pg - entropy_coef * entropy + kl_loss_coef * KL(pi, ref), each reduced with ``weights``.

    logp carries the gradient; old_logp, advantages, ref_logp, is_weights are treated as constants.
    trainer.importance_level=sequence uses GSPO's sequence-level ratio (``mask`` marks each row's valid tokens;
    default weights > 0); the registered trainer.policy_loss turns the ratio into a per-token loss.
    ``is_weights``, trainer.off_policy_correction's importance weights (off_policy.py), multiply the per-token
    pg loss.
    Metrics are detached weighted sums: add them over micro-batches, all-reduce SUM over ranks.
    Under DDP (which averages gradients) backprop ``loss * world_size``.
    """
    old = old_logp.detach()
    adv = advantages.detach()
    valid = (weights > 0) if mask is None else mask.bool()
    log_ratio = gspo_log_ratio(logp, old, valid) if cfg.importance_level == "sequence" else logp - old
    pg, per_token = get_policy_loss(cfg.policy_loss).fn(log_ratio, adv, cfg)
    if not isinstance(pg, torch.Tensor) or pg.shape != logp.shape:
        got = tuple(pg.shape) if isinstance(pg, torch.Tensor) else type(pg).__name__
        raise ValueError(f"policy loss {cfg.policy_loss!r} returned a loss of shape {got}, "
                         f"expected the per-token shape {tuple(logp.shape)}")
    metrics: dict[str, torch.Tensor] = {}
    if is_weights is not None:
        pg = pg * is_weights.detach()
    pg_loss = reduce(pg, weights)
    loss = pg_loss
    metrics["pg_loss"] = pg_loss.detach()
    for name, values in per_token.items():
        metrics[name] = reduce(values.detach().float(), weights)
    metrics["ppo_kl"] = reduce((old - logp).detach(), weights)
    if cfg.entropy_coef != 0.0 and entropy is None:
        raise ValueError("trainer.entropy_coef is non-zero: pass the per-token entropy")
    if entropy is not None:
        ent = reduce(entropy, weights)
        metrics["entropy"] = ent.detach()
        if cfg.entropy_coef != 0.0:
            loss = loss - cfg.entropy_coef * ent
    if cfg.kl_loss_coef != 0.0 and ref_logp is None:
        raise ValueError("trainer.kl_loss_coef is non-zero: pass the reference log-probs")
    if ref_logp is not None:
        kl = reduce(kl_penalty(logp, ref_logp.detach(), cfg.kl_loss_type), weights)
        metrics["kl"] = kl.detach()
        if cfg.kl_loss_coef != 0.0:
            loss = loss + cfg.kl_loss_coef * kl
    metrics["loss"] = loss.detach()
    return loss, metrics
