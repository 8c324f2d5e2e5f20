"""Batched next-token sampling with per-row parameters.

Log-probs: the reported log-prob of a sampled token is log_softmax(logits / T) over the FULL vocabulary
(T = the row's temperature; T = 1 for greedy rows), before top-k / top-p / min-p / penalties / logit_bias
(the bias shapes the draw like a penalty; SGLang would report the biased distribution). That is
exactly what the trainer recomputes, so importance ratios start at 1. The filters only shape the draw.
A grammar-constrained row is the exception: its disallowed tokens are -inf before anything else, so its
log-probs are those of the masked, renormalised distribution it was actually sampled from.

Sampling draws by inverse CDF with one uniform number per row (random numbers per vocabulary entry cost 20x
more); a row with `sampling_seed` takes its number from its own generator, so the same seed gives the same
tokens whatever else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from slimecli.rollout.engine.protocol import SamplingParams

NEG_INF = float("-inf")
EXACT_CDF_VOCAB = 65536  # up to this vocabulary size the cdf is summed in float64


@dataclass
class RowState:
    """What the sampler needs to know about one running sequence."""

    params: SamplingParams
    generator: torch.Generator | None
    output_ids: list[int]
    prompt_ids: list[int]
    blocked: list[int]  # token ids forbidden at this step (min_new_tokens)
    top_n: int = 0
    ids_logprob: tuple[int, ...] | None = None  # token_ids_logprob: report these ids' log-probs too


@dataclass
class Draw:
    tokens: list[int]
    logprobs: list[float]
    top: list[list[tuple[float, int]] | None]
    ids: list[list[tuple[float, int]] | None] = field(default_factory=list)  # token_ids_logprob, per row


def _apply_penalties(logits: torch.Tensor, rows: list[RowState]) -> None:
    vocab = logits.shape[-1]
    for i, r in enumerate(rows):
        p = r.params
        if not p.penalized:
            continue
        if r.output_ids and (p.frequency_penalty or p.presence_penalty):
            ids = torch.tensor(r.output_ids, device=logits.device)
            counts = torch.bincount(ids, minlength=vocab)[:vocab].to(logits.dtype)
            logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
        if p.logit_bias:  # SGLang adds it to the raw logits, before the temperature
            ids = torch.tensor([t for t, _ in p.logit_bias], dtype=torch.long, device=logits.device)
            logits[i, ids] += torch.tensor([b for _, b in p.logit_bias], dtype=logits.dtype, device=logits.device)
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(r.prompt_ids) | set(r.output_ids)), dtype=torch.long,
                                device=logits.device)
            vals = logits[i, seen]
            logits[i, seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)


def _filter(scaled: torch.Tensor, rows: list[RowState]) -> torch.Tensor:
    """top-k, top-p, min-p on temperature-scaled logits (rows without them are left alone)."""
    vocab, dev = scaled.shape[-1], scaled.device
    ks = [r.params.top_k if 0 < r.params.top_k < vocab else vocab for r in rows]
    if any(k < vocab for k in ks):
        kmax = max(k for k in ks if k < vocab)
        top_vals = scaled.topk(kmax, dim=-1).values
        idx = torch.tensor([min(k, kmax) - 1 for k in ks], device=dev).unsqueeze(1)
        kth = top_vals.gather(1, idx)
        keep_all = torch.tensor([k >= vocab for k in ks], device=dev).unsqueeze(1)
        scaled = scaled.masked_fill((scaled < kth) & ~keep_all, NEG_INF)
    ps = torch.tensor([r.params.top_p for r in rows], dtype=scaled.dtype, device=dev)
    if bool((ps < 1.0).any()):
        sorted_vals, order = scaled.sort(dim=-1, descending=True)
        probs = sorted_vals.softmax(-1)
        before = probs.cumsum(-1) - probs  # mass strictly above each token
        drop_sorted = before > ps.unsqueeze(1)  # the first token is always kept
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, NEG_INF)
    mins = torch.tensor([r.params.min_p for r in rows], dtype=scaled.dtype, device=dev)
    if bool((mins > 0).any()):
        probs = scaled.softmax(-1)
        scaled = scaled.masked_fill(probs < mins.unsqueeze(1) * probs.max(-1, keepdim=True).values, NEG_INF)
    return scaled


def _draw(probs: torch.Tensor, rows: list[RowState], default_gen: torch.Generator | None) -> torch.Tensor:
    """Inverse-CDF draw: one uniform number per row (a row's own generator when it has a seed)."""
    vocab = probs.shape[1]
    cdf = (probs.double() if vocab <= EXACT_CDF_VOCAB else probs).cumsum(-1)
    u = torch.rand(len(rows), 1, generator=default_gen, device=probs.device, dtype=cdf.dtype)
    for i, r in enumerate(rows):
        if r.generator is not None:
            u[i] = torch.rand(1, generator=r.generator, device=probs.device, dtype=cdf.dtype)
    # right=True skips zero-probability tokens (their cdf equals the previous one); u < total keeps it in range
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(1).clamp_(max=vocab - 1)


def sample(logits: torch.Tensor, rows: list[RowState], default_gen: torch.Generator | None = None,
           allowed: tuple[list[int], torch.Tensor] | None = None) -> Draw:
    """logits: [rows, vocab] for the next position. Returns sampled ids and their full-vocabulary log-probs.

    allowed: (row indices, [len(indices), vocab] bool) for the grammar-constrained rows.
    """
    logits = logits.float()
    dev = logits.device
    constrained: set[int] = set()
    if allowed is not None:
        which, ok = allowed
        constrained = set(which)
        index = torch.tensor(which, device=dev)
        logits = logits.index_put((index,), logits.index_select(0, index).masked_fill(~ok, NEG_INF))
    temps = torch.tensor([1.0 if r.params.greedy else r.params.temperature for r in rows], device=dev)
    scaled = logits / temps.unsqueeze(1)
    logp = torch.log_softmax(scaled, dim=-1)

    shaped = scaled
    if any(r.params.penalized for r in rows):
        shaped_logits = logits.clone()
        _apply_penalties(shaped_logits, rows)
        shaped = shaped_logits / temps.unsqueeze(1)
    if any(r.blocked for r in rows):
        shaped = shaped.clone() if shaped is scaled else shaped
        for i, r in enumerate(rows):
            if r.blocked:
                before = shaped[i].clone() if i in constrained else None
                shaped[i, r.blocked] = NEG_INF
                if before is not None and not bool(torch.isfinite(shaped[i]).any()):
                    shaped[i] = before  # the grammar allows only blocked tokens (its end): the grammar wins
    if any(r.params.top_k > 0 or r.params.top_p < 1.0 or r.params.min_p > 0 for r in rows if not r.params.greedy):
        shaped = _filter(shaped, rows)

    greedy = [r.params.greedy for r in rows]
    if all(greedy):
        tokens_t = shaped.argmax(-1)
    else:
        probs = logp.exp() if shaped is scaled else shaped.softmax(-1)
        tokens_t = _draw(probs, rows, default_gen)
        if any(greedy):
            tokens_t = torch.where(torch.tensor(greedy, device=dev), shaped.argmax(-1), tokens_t)
    chosen = logp.gather(1, tokens_t.unsqueeze(1)).squeeze(1)
    tokens, lps = tokens_t.tolist(), chosen.tolist()
    top: list[list[tuple[float, int]] | None] = [None] * len(rows)
    n_top = max(r.top_n for r in rows)
    if n_top:
        vals, idx = logp.topk(min(n_top, logp.shape[1]), dim=-1)
        for i, r in enumerate(rows):
            if r.top_n:
                top[i] = [(v, t) for v, t in zip(vals[i, :r.top_n].tolist(), idx[i, :r.top_n].tolist(), strict=True)
                          if v != NEG_INF]  # a grammar's disallowed tokens are not candidates
    ids_lp: list[list[tuple[float, int]] | None] = [None] * len(rows)
    for i, r in enumerate(rows):
        if r.ids_logprob:
            want = list(r.ids_logprob)
            got = logp[i, torch.tensor(want, device=dev)].tolist()
            ids_lp[i] = list(zip(got, want, strict=True))
    return Draw(tokens, lps, top, ids_lp)


def make_generator(seed: int | None, copy: int = 0, device: str | torch.device = "cpu") -> torch.Generator | None:
    """A per-request generator for sampling_seed; copy j of an n>1 request uses seed + j."""
    if seed is None:
        return None
    return torch.Generator(device=device).manual_seed((seed + copy) % (1 << 63))
