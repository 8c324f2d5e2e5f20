"""Log-probs and sampling over vocabulary-sharded logits, without ever gathering the full vocabulary.

Each tensor-parallel rank holds logits [N, v] for the rows [start, start + v) of a vocabulary padded to a
multiple of tp. Only O(N * (tp + n)) numbers cross ranks: the row max, the log-sum-exp, the per-rank
probability mass, the owner of each sample slot and the merged samples. Padded rows (ids >= vocab_size)
are sliced off before any reduction, so they never carry mass and can never be sampled.
Every function takes the TP process group; None means one rank and no communication. Tensors stay on the
logits' device (a generator, if given, must live there too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class VocabShard:
    """Which slice of the (padded) vocabulary one TP rank owns."""

    vocab_size: int  # the real vocabulary
    tp: int = 1
    rank: int = 0

    @property
    def size(self) -> int:  # rows per rank, padding included
        return -(-self.vocab_size // self.tp)

    @property
    def padded_size(self) -> int:
        return self.size * self.tp

    @property
    def start(self) -> int:
        return self.rank * self.size

    @property
    def valid(self) -> int:  # real (unpadded) rows on this rank
        return max(0, min(self.size, self.vocab_size - self.start))


@dataclass(frozen=True)
class Stats:
    """Global row max and log Z (of logits / temperature, relative to max), and this rank's Σexp."""

    max: torch.Tensor  # [N] fp32
    logz: torch.Tensor  # [N] fp32
    local_sum: torch.Tensor  # [N] fp32


def _world(group: dist.ProcessGroup | None) -> int:
    """group=None means a single rank with no communication (not the default world group)."""
    if group is None or not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def _all_reduce(t: torch.Tensor, op: dist.ReduceOp | dist.ReduceOp.RedOpType,
                group: dist.ProcessGroup | None) -> torch.Tensor:
    if _world(group) > 1:
        dist.all_reduce(t, op=op, group=group)
    return t


def _check(local: torch.Tensor, shard: VocabShard, group: dist.ProcessGroup | None) -> None:
    if local.dim() != 2 or local.shape[1] != shard.size:
        raise ValueError(f"local logits must be [N, {shard.size}], got {tuple(local.shape)}")
    if _world(group) != shard.tp:
        raise ValueError(f"shard says tp={shard.tp} but the group has {_world(group)} ranks")


def _chunks(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, max(1, size))]


class Workspace:
    """One reusable fp32 [chunk, v] scratch buffer.

    On CPU a fresh buffer per chunk costs more in page faults than the arithmetic on it, so a server keeps
    one between requests (the CUDA caching allocator does the same on GPU). It never exceeds one chunk.
    """

    def __init__(self) -> None:
        self._buf = torch.empty(0, dtype=torch.float32)

    def get(self, rows: int, cols: int, device: torch.device | str = "cpu") -> torch.Tensor:
        if self._buf.numel() < rows * cols or self._buf.device != torch.device(device):
            self._buf = torch.empty(rows * cols, dtype=torch.float32, device=device)
        return self._buf[: rows * cols].view(rows, cols)


def _exp_shifted(local: torch.Tensor, rows: slice, shard: VocabShard, m: torch.Tensor, temperature: float,
                 workspace: Workspace | None) -> torch.Tensor:
    """exp(logits / T - max) for the real rows of one chunk: the only [chunk, v] fp32 temporary."""
    part = local[rows, : shard.valid]
    x = (workspace or Workspace()).get(part.shape[0], part.shape[1], part.device).copy_(part)
    if temperature != 1.0:
        x.div_(temperature)
    return x.sub_(m[rows, None]).exp_()


@torch.no_grad()
def global_stats(local: torch.Tensor, shard: VocabShard, group: dist.ProcessGroup | None = None,
                 temperature: float = 1.0, chunk_size: int = 4096, workspace: Workspace | None = None) -> Stats:
    """All-reduce MAX of the row max, then chunked local Σexp in fp32 and all-reduce SUM."""
    _check(local, shard, group)
    n = local.shape[0]
    m = torch.full((n,), -math.inf, dtype=torch.float32, device=local.device)
    if shard.valid:
        for rows in _chunks(n, chunk_size):
            m[rows] = local[rows, : shard.valid].amax(-1).to(torch.float32) / temperature
    _all_reduce(m, dist.ReduceOp.MAX, group)
    local_sum = torch.zeros(n, dtype=torch.float32, device=local.device)
    if shard.valid:
        for rows in _chunks(n, chunk_size):
            local_sum[rows] = _exp_shifted(local, rows, shard, m, temperature, workspace).sum(-1)
    z = _all_reduce(local_sum.clone(), dist.ReduceOp.SUM, group)
    return Stats(m, z.log(), local_sum)


def _gather_log_probs(local: torch.Tensor, ids: torch.Tensor, shard: VocabShard, stats: Stats, rows: slice,
                      temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """log p of global `ids` [r, k] for the ids this rank owns (mask says which)."""
    own = (ids >= shard.start) & (ids < shard.start + shard.valid)
    idx = (ids - shard.start).clamp(0, max(shard.valid - 1, 0))
    picked = local[rows].gather(-1, idx).to(torch.float32) / temperature
    return picked - stats.max[rows, None] - stats.logz[rows, None], own


@torch.no_grad()
def label_log_probs(local: torch.Tensor, labels: torch.Tensor, shard: VocabShard,
                    group: dist.ProcessGroup | None = None, temperature: float = 1.0, chunk_size: int = 4096,
                    stats: Stats | None = None) -> torch.Tensor:
    """log p(label) for labels [N, K] of global ids in [0, vocab_size): each owner fills its ids, all-reduce SUM."""
    _check(local, shard, group)
    if labels.dim() != 2 or labels.shape[0] != local.shape[0]:
        raise ValueError(f"labels must be [{local.shape[0]}, K], got {tuple(labels.shape)}")
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= shard.vocab_size):
        raise ValueError(f"label ids must be in [0, {shard.vocab_size})")
    stats = stats or global_stats(local, shard, group, temperature, chunk_size)
    labels = labels.to(device=local.device, dtype=torch.long)
    out = torch.zeros(labels.shape, dtype=torch.float32, device=local.device)
    if shard.valid and labels.shape[1]:
        for rows in _chunks(local.shape[0], chunk_size):
            logp, own = _gather_log_probs(local, labels[rows], shard, stats, rows, temperature)
            out[rows] = torch.where(own, logp, 0.0)
    return _all_reduce(out, dist.ReduceOp.SUM, group)


@torch.no_grad()
def next_token_log_probs(local: torch.Tensor, next_ids: torch.Tensor, shard: VocabShard,
                         group: dist.ProcessGroup | None = None, temperature: float = 1.0, chunk_size: int = 4096,
                         stats: Stats | None = None) -> torch.Tensor:
    """log p(next_ids[i] | position i) for next_ids [N]: the label path with one label per row."""
    return label_log_probs(local, next_ids.reshape(-1, 1), shard, group, temperature, chunk_size, stats)[:, 0]


def _draw_owners(stats: Stats, n: int, shard: VocabShard, group: dist.ProcessGroup | None,
                 generator: torch.Generator | None) -> torch.Tensor:
    """Which rank serves each of the n slots of each row: drawn on group rank 0 from the gathered masses."""
    rows = stats.max.shape[0]
    if shard.tp == 1:
        return torch.zeros((rows, n), dtype=torch.long, device=stats.max.device)
    mass = stats.local_sum / stats.logz.exp()  # this rank's share of each row's probability
    parts = [torch.empty_like(mass) for _ in range(shard.tp)]
    dist.all_gather(parts, mass, group=group)
    owners = torch.empty((rows, n), dtype=torch.long, device=stats.max.device)
    if shard.rank == 0 and rows:
        owners = torch.multinomial(torch.stack(parts, dim=1).clamp_(min=0), n, replacement=True, generator=generator)
    assert group is not None  # tp > 1, and _check matched it against the group's size
    dist.broadcast(owners, src=dist.get_global_rank(group, 0), group=group)
    return owners


@torch.no_grad()
def sample(local: torch.Tensor, n: int, shard: VocabShard, group: dist.ProcessGroup | None = None,
           temperature: float = 1.0, chunk_size: int = 4096, stats: Stats | None = None,
           generator: torch.Generator | None = None, workspace: Workspace | None = None,
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """n independent samples per row from softmax(logits / T): ids [N, n] (global) and their log-probs [N, n].

    A slot's owner rank is drawn with probability equal to that rank's mass, then the owner draws a token
    from its shard's conditional distribution (inverse CDF over one chunk at a time); merged by MAX.
    """
    _check(local, shard, group)
    rows_total = local.shape[0]
    if n < 0:
        raise ValueError("sample_n must be >= 0")
    if n == 0:
        return (torch.empty((rows_total, 0), dtype=torch.long, device=local.device),
                torch.empty((rows_total, 0), dtype=torch.float32, device=local.device))
    stats = stats or global_stats(local, shard, group, temperature, chunk_size, workspace)
    owners = _draw_owners(stats, n, shard, group, generator)
    ids = torch.full((rows_total, n), -1, dtype=torch.long, device=local.device)
    logps = torch.full((rows_total, n), -math.inf, dtype=torch.float32, device=local.device)
    if shard.valid:
        for rows in _chunks(rows_total, chunk_size):
            mine = owners[rows] == shard.rank
            if not bool(mine.any()):
                continue
            cdf = _exp_shifted(local, rows, shard, stats.max, temperature, workspace).cumsum_(-1)
            u = torch.rand((cdf.shape[0], n), generator=generator, device=cdf.device) * cdf[:, -1:]
            local_idx = torch.searchsorted(cdf, u, right=True).clamp_(max=shard.valid - 1)
            del cdf
            global_ids = local_idx + shard.start
            logp, _ = _gather_log_probs(local, global_ids, shard, stats, rows, temperature)
            ids[rows] = torch.where(mine, global_ids, -1)
            logps[rows] = torch.where(mine, logp, -math.inf)
    _all_reduce(ids, dist.ReduceOp.MAX, group)
    _all_reduce(logps, dist.ReduceOp.MAX, group)
    return ids, logps
