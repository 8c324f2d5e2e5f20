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

from slimecli.engine.protocol import SamplingParams
from slimecli.model.softmax import LN2, log2_weights

NEG_INF = float("-inf")
NAN = float("nan")
CDF_BLOCK = 64  # tokens per block of the two-level draw
UNIFORM_AHEAD = 64  # numbers a seeded row's CPU generator draws at once


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
    logprob: bool = True  # report the sampled token's log-prob (a batch where no row does skips computing them)
    greedy: bool = field(init=False)
    temperature: float = field(init=False)
    penalized: bool = field(init=False)
    filtered: bool = field(init=False)  # top-k, top-p or min-p shape the draw
    reports: bool = field(init=False)  # log-probs of any kind are asked for
    _uniforms: list[float] = field(init=False, default_factory=list)  # the generator's next numbers, drawn ahead

    def __post_init__(self) -> None:
        """What every step asks of the (immutable) params, read once: the sampler's checks run per row per step."""
        p = self.params
        self.greedy = p.greedy
        self.temperature = 1.0 if p.greedy else p.temperature  # log-probs of greedy rows are at T = 1
        self.penalized = p.penalized
        self.filtered = not p.greedy and (p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0)
        self.reports = self.logprob or bool(self.top_n) or bool(self.ids_logprob)

    def uniform(self) -> float:
        """The row's next uniform number from its own (CPU) generator, drawn UNIFORM_AHEAD at a time: the stream is
        the same drawn one by one or in a block, and a call per row per step was most of a seeded batch's draw."""
        assert self.generator is not None
        if not self._uniforms:
            self._uniforms = torch.rand(UNIFORM_AHEAD, generator=self.generator, dtype=torch.float64).tolist()[::-1]
        return self._uniforms.pop()


@dataclass
class Draw:
    tokens: list[int]
    logprobs: list[float]  # NaN for every row when no row of the batch asked for log-probs
    top: list[list[tuple[float, int]] | None]
    ids: list[list[tuple[float, int]] | None] = field(default_factory=list)  # token_ids_logprob, per row


def argmax(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(-1), the same ids (the first maximum of each row; NaN counts as the maximum, as for argmax): on a
    CPU, max over a dimension takes a third of the time of argmax."""
    return x.max(-1).indices


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


def _draw(weights: torch.Tensor, rows: list[RowState], default_gen: torch.Generator | None) -> torch.Tensor:
    """Inverse-CDF draw over unnormalised weights [rows, V]: one uniform number per row (a row's own generator
    when it has a seed). Two levels: the cdf of blocks of CDF_BLOCK tokens picks a block, then the cdf inside
    it picks the token. Each block sums in float32 (64 terms: a relative error near 1e-7) and everything after
    in float64, so a large vocabulary's tail is drawn as exactly as its head; a full float64 cumsum would
    convert and sweep the whole [rows, V] tensor twice, a quarter of a small engine's decode step."""
    n, vocab = weights.shape
    u = torch.rand(n, 1, generator=default_gen, device=weights.device, dtype=torch.float64)
    seeded = [i for i, r in enumerate(rows) if r.generator is not None]
    if seeded:  # one write for all of them: a write per row cost more than its draw
        dev = weights.device
        if dev.type == "cpu":
            own = torch.tensor([rows[i].uniform() for i in seeded], dtype=torch.float64)
        else:  # another device's generator advances per call: one number a call, as the stream was drawn
            own = torch.cat([torch.rand(1, generator=rows[i].generator, device=dev, dtype=torch.float64)
                             for i in seeded])
        u[torch.tensor(seeded, device=dev), 0] = own.to(dev)
    full = vocab // CDF_BLOCK * CDF_BLOCK
    block_sums = weights[:, :full].reshape(n, -1, CDF_BLOCK).sum(-1)
    if full < vocab:  # the last, shorter block
        block_sums = torch.cat([block_sums, weights[:, full:].sum(-1, keepdim=True)], dim=1)
    block_sums = block_sums.double()  # summed in float64 from here: no drift across a large vocabulary
    block_cdf = block_sums.cumsum(-1)
    total = block_cdf[:, -1:]
    target = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))  # below the total
    # right=True skips blocks and tokens of zero weight (their cdf equals the previous one)
    block = torch.searchsorted(block_cdf, target, right=True).clamp_(max=block_cdf.shape[1] - 1)
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp_(min=0)), 0.0)
    # where in its block, as a fraction of the block's weight: the block's own cdf ends at exactly 1
    below_one = 1.0 - torch.finfo(torch.float64).eps  # rounding never carries the draw past the block's last token
    into = ((target - before) / block_sums.gather(1, block)).clamp_(0.0, below_one)
    columns = (block * CDF_BLOCK + torch.arange(CDF_BLOCK, device=weights.device)).clamp_(max=vocab - 1)
    inside = weights.gather(1, columns).double()
    if full < vocab:  # a short last block: its clamped tail repeats the last column
        inside[columns.diff(dim=1, prepend=columns[:, :1] - 1) == 0] = 0.0
    inside_cdf = inside.cumsum(-1)
    inside_cdf = inside_cdf / inside_cdf[:, -1:]
    offset = torch.searchsorted(inside_cdf, into, right=True).clamp_(max=CDF_BLOCK - 1)
    return (block * CDF_BLOCK + offset).squeeze(1).clamp_(max=vocab - 1)


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
    temps = [r.temperature for r in rows]
    temps_t = torch.tensor(temps, device=dev).unsqueeze(1)
    scaled = logits if all(t == 1.0 for t in temps) else logits / temps_t

    shaped = scaled
    if any(r.penalized for r in rows):
        shaped_logits = logits.clone()
        _apply_penalties(shaped_logits, rows)
        shaped = shaped_logits / temps_t
    if any(r.blocked for r in rows):
        shaped = shaped.clone() if shaped is scaled else shaped
        for i, r in enumerate(rows):
            if r.blocked:
                before = shaped[i].clone() if i in constrained else None
                shaped[i, r.blocked] = NEG_INF
                if before is not None and not bool(torch.isfinite(shaped[i]).any()):
                    shaped[i] = before  # the grammar allows only blocked tokens (its end): the grammar wins
    if any(r.filtered for r in rows):
        shaped = _filter(shaped, rows)

    greedy = [r.greedy for r in rows]
    reported = any(r.reports for r in rows)
    if not reported and all(greedy):  # nothing but the argmax is needed
        return Draw(argmax(shaped).tolist(), [NAN] * len(rows), [None] * len(rows), [None] * len(rows))
    log2_w, _ = log2_weights(scaled)  # the reported log-probs come from these, the draw from their exp2
    weights = torch.exp2(log2_w)
    if all(greedy):
        tokens_t = argmax(shaped)
    else:
        tokens_t = _draw(weights if shaped is scaled else shaped.softmax(-1), rows, default_gen)
        if any(greedy):
            tokens_t = torch.where(torch.tensor(greedy, device=dev), argmax(shaped), tokens_t)
    if not reported:
        return Draw(tokens_t.tolist(), [NAN] * len(rows), [None] * len(rows), [None] * len(rows))
    log_total = weights.sum(-1, keepdim=True).log()
    chosen = log2_w.gather(1, tokens_t.unsqueeze(1)).squeeze(1).mul_(LN2).sub_(log_total.squeeze(1))
    tokens, lps = tokens_t.tolist(), chosen.tolist()
    top: list[list[tuple[float, int]] | None] = [None] * len(rows)
    ids_lp: list[list[tuple[float, int]] | None] = [None] * len(rows)
    n_top = max(r.top_n for r in rows)
    if not n_top and not any(r.ids_logprob for r in rows):
        return Draw(tokens, lps, top, ids_lp)
    logp = log2_w.mul_(LN2).sub_(log_total)  # every token's log-prob, in place
    if n_top:
        vals, idx = logp.topk(min(n_top, logp.shape[1]), dim=-1)
        for i, r in enumerate(rows):
            if r.top_n:
                top[i] = [(v, t) for v, t in zip(vals[i, :r.top_n].tolist(), idx[i, :r.top_n].tolist(), strict=True)
                          if v != NEG_INF]  # a grammar's disallowed tokens are not candidates
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
