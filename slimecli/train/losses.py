"""Policy-gradient loss pieces: log-probs at a temperature, entropy, PPO clip, GSPO ratio, KL, TIS, reduction.

``policy_loss`` wraps the registered per-token policy loss (trainer.policy_loss, built-in ``ppo_clip``) with
the importance ratio (trainer.importance_level), TIS, the reduction, entropy and KL terms.

Layout: per-token tensors of one shape (typically [B, T], right-padded responses). ``weights`` from
``loss_weights`` carry both the loss mask and the reduction, so every loss and metric here is a plain
weighted sum: summing it over the micro-batches (and ranks) of a step gives the step's value.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F

from slimecli.config.groups.trainer import TrainerConfig
from slimecli.rollout.sample import Sample
from slimecli.train.registry import get_policy_loss, register_policy_loss, resolve_deprecated

LOW_VAR_KL_CLAMP = 10.0


def _scaled_chunks(logits: torch.Tensor, temperature: float, chunk_size: int) -> Iterator[tuple[slice, torch.Tensor]]:
    """logits [..., V] as float32 rows / T, ``chunk_size`` rows at a time (never a second full [N, V] tensor)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    rows, inv_t = logits.reshape(-1, logits.shape[-1]), 1.0 / temperature
    for start in range(0, rows.shape[0], chunk_size):
        chunk = rows[start:start + chunk_size].float()
        yield slice(start, start + chunk_size), chunk * inv_t if inv_t != 1.0 else chunk


def _joined(parts: list[torch.Tensor], shape: torch.Size, like: torch.Tensor) -> torch.Tensor:
    """The chunks' per-row values as one float32 tensor of ``shape`` (on ``like``'s device when there are none)."""
    return (torch.cat(parts) if parts else like.new_zeros(0, dtype=torch.float32)).reshape(shape)


def log_probs_from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                          chunk_size: int = 4096) -> torch.Tensor:
    """log softmax(logits / T)[target] for every position, without keeping a full [N, V] log-softmax.

    logits [..., V], targets [...] -> [...] (float32). Rows are processed in chunks of ``chunk_size``.
    """
    flat_targets = targets.reshape(-1, 1).long()
    out = [scaled.gather(-1, flat_targets[rows]).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
           for rows, scaled in _scaled_chunks(logits, temperature, chunk_size)]
    return _joined(out, targets.shape, logits)


def log_probs_and_entropy(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, *,
                          entropy_grad: bool = False, chunk_size: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """log_probs_from_logits and entropy_from_logits in one pass over each chunk: the entropy reuses the
    log-normaliser (H = logsumexp(x) - sum softmax(x) * x), which saves a log-softmax of [N, V] a micro-batch.

    The entropy is in the graph only with ``entropy_grad`` (an entropy bonus); otherwise it is a metric.
    """
    flat_targets = targets.reshape(-1, 1).long()
    logps, entropies = [], []
    for rows, scaled in _scaled_chunks(logits, temperature, chunk_size):
        lse = torch.logsumexp(scaled, dim=-1)
        logps.append(scaled.gather(-1, flat_targets[rows]).squeeze(-1) - lse)
        with torch.enable_grad() if entropy_grad else torch.no_grad():
            x = scaled if entropy_grad else scaled.detach()
            entropies.append(lse - torch.linalg.vecdot(torch.softmax(x, dim=-1), x))
    return _joined(logps, targets.shape, logits), _joined(entropies, logits.shape[:-1], logits)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0, chunk_size: int = 4096) -> torch.Tensor:
    """Entropy of softmax(logits / T) per position: logits [..., V] -> [...] (float32)."""
    out = []
    for _, scaled in _scaled_chunks(logits, temperature, chunk_size):
        logp = F.log_softmax(scaled, dim=-1)
        out.append(-(logp.exp() * logp).sum(-1))
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


def loss_weights(samples: Sequence[Sample], reduction: str = "per_rollout") -> list[torch.Tensor]:
    """Per-token reduction weights for every sample of one optimizer step (computed once for the whole step).

    per_rollout: mask / (total mask of the token's rollout) / (number of rollouts in the step); samples
    sharing a ``rollout_id`` are one rollout, a sample without one is its own. Rollouts whose mask is all
    zero (remove_sample, aborted) still count in the number of rollouts: they stay in the batch.
    per_token: mask / (total mask of the step).
    """
    masks = [torch.tensor(s.effective_loss_mask(), dtype=torch.float32) for s in samples]
    if reduction == "per_token":
        total = max(float(sum(m.sum() for m in masks)), 1.0)
        return [m / total for m in masks]
    if reduction != "per_rollout":
        raise ValueError(f"unknown loss reduction {reduction!r}")
    keys = [("rollout", s.rollout_id) if s.rollout_id is not None else ("sample", i) for i, s in enumerate(samples)]
    totals: dict[tuple[str, int], float] = {}
    for key, m in zip(keys, masks, strict=True):
        totals[key] = totals.get(key, 0.0) + float(m.sum())
    n_rollouts = max(len(totals), 1)
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


@register_policy_loss("ppo_clip")
def ppo_clip(log_ratio: torch.Tensor, advantages: torch.Tensor, cfg: TrainerConfig
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate (dual clip with trainer.eps_clip_c), with its clip indicators as metrics."""
    loss, clipped, dual = ppo_clip_loss(log_ratio, advantages, cfg.eps_clip, cfg.eps_clip_high, cfg.eps_clip_c)
    metrics = {"pg_clipfrac": clipped}
    if cfg.eps_clip_c is not None:
        metrics["pg_dual_clipfrac"] = dual
    return loss, metrics


def tis_weights(old_logp: torch.Tensor, rollout_logp: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Truncated importance sampling: clamp(exp(old - rollout), low, high), detached."""
    return torch.exp(old_logp.detach().float() - rollout_logp.detach().float()).clamp(low, high)


def reduce(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted sum with ``loss_weights`` (so the per-step loss is a sum over micro-batches)."""
    return (values * weights).sum()


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, weights: torch.Tensor,
                cfg: TrainerConfig, *, mask: torch.Tensor | None = None, entropy: torch.Tensor | None = None,
                ref_logp: torch.Tensor | None = None, rollout_logp: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """pg - entropy_coef * entropy + kl_loss_coef * KL(pi, ref), each reduced with ``weights``.

    logp carries the gradient; old_logp, advantages, ref_logp, rollout_logp are treated as constants.
    trainer.importance_level=sequence uses GSPO's sequence-level ratio (``mask`` marks each row's valid tokens;
    default weights > 0); the registered trainer.policy_loss turns the ratio into a per-token loss.
    TIS (trainer.use_tis) multiplies the per-token pg loss by ``tis_weights(old, rollout)``.
    Metrics are detached weighted sums: add them over micro-batches, all-reduce SUM over ranks.
    Under DDP (which averages gradients) backprop ``loss * world_size``.
    """
    cfg = resolve_deprecated(cfg)
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
    if cfg.use_tis:
        if rollout_logp is None:
            raise ValueError("trainer.use_tis needs the rollout log-probs")
        tis = tis_weights(old, rollout_logp, cfg.tis_clip_low, cfg.tis_clip_high)
        raw = torch.exp(old.float() - rollout_logp.detach().float())
        pg = pg * tis
        metrics["tis"] = reduce(tis, weights).detach()
        metrics["tis_clipfrac"] = reduce((raw != tis).float(), weights).detach()
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
