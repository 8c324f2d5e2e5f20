"""Run on gloo ranks: checks the vocab-parallel ops against a full-vocabulary reference.

Every rank writes its findings to OUT/rank<R>.json; the pytest side asserts on them.
"""

from __future__ import annotations

import json
import math
import os
import sys

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from slimecli.teacher import vocab_parallel as vp


class ShapeRecorder(TorchDispatchMode):
    """Records the largest tensor any op creates, and the widest row of any 2-D+ one (inputs are made before)."""

    def __init__(self) -> None:
        super().__init__()
        self.max_numel = 0
        self.max_last_dim = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.max_numel = max(self.max_numel, t.numel())
                if t.dim() >= 2:
                    self.max_last_dim = max(self.max_last_dim, t.shape[-1])
        return out


def shard_of(full: torch.Tensor, shard: vp.VocabShard, pad_value: float) -> torch.Tensor:
    """This rank's [N, size] slice; padded rows get a huge logit so that sampling them would show."""
    local = torch.full((full.shape[0], shard.size), pad_value, dtype=full.dtype)
    part = full[:, shard.start: shard.start + shard.valid]
    local[:, : part.shape[1]] = part
    return local


def chi_square_bound(dof: int) -> float:
    """Upper 0.1% point of chi-square (Wilson-Hilferty)."""
    z = 3.09
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def check_exactness(rank: int, tp: int, group, vocab: int, temperature: float) -> dict:
    gen = torch.Generator().manual_seed(1234 + vocab)
    n_rows, k = 37, 5
    full = torch.randn(n_rows, vocab, generator=gen, dtype=torch.float32) * 3
    labels = torch.randint(0, vocab, (n_rows, k), generator=gen)
    nxt = torch.randint(0, vocab, (n_rows,), generator=gen)
    ref = torch.log_softmax(full / temperature, dim=-1)
    # TP=1 in-process (no communication) and TP=tp over gloo, small chunks so that chunking is exercised.
    one = vp.VocabShard(vocab, 1, 0)
    lab1 = vp.label_log_probs(full, labels, one, None, temperature, chunk_size=8)
    nxt1 = vp.next_token_log_probs(full, nxt, one, None, temperature, chunk_size=8)
    shard = vp.VocabShard(vocab, tp, rank)
    local = shard_of(full, shard, pad_value=80.0)
    rec = ShapeRecorder()
    with rec:
        stats = vp.global_stats(local, shard, group, temperature, chunk_size=8)
        lab = vp.label_log_probs(local, labels, shard, group, temperature, chunk_size=5, stats=stats)
        nx = vp.next_token_log_probs(local, nxt, shard, group, temperature, chunk_size=5, stats=stats)
        ids, logps = vp.sample(local, 6, shard, group, temperature, chunk_size=8, stats=stats,
                               generator=torch.Generator().manual_seed(7 + rank))
    ref_sampled = ref.gather(-1, ids.clamp(0, vocab - 1))
    return {
        "vocab": vocab, "temperature": temperature,
        "label_tp_vs_tp1": float((lab - lab1).abs().max()),
        "next_tp_vs_tp1": float((nx - nxt1).abs().max()),
        "label_vs_ref": float((lab - ref.gather(-1, labels)).abs().max()),
        "next_vs_ref": float((nx - ref.gather(-1, nxt[:, None])[:, 0]).abs().max()),
        "sampled_min_id": int(ids.min()), "sampled_max_id": int(ids.max()),
        "sampled_logp_vs_ref": float((logps - ref_sampled).abs().max()),
        "max_numel_created": rec.max_numel, "max_last_dim_created": rec.max_last_dim,
        "full_numel": n_rows * vocab, "local_numel": n_rows * shard.size,
        "all_ranks_same_ids": _same_everywhere(ids, group),
    }


def _same_everywhere(t: torch.Tensor, group) -> bool:
    lo, hi = t.clone(), t.clone()
    dist.all_reduce(lo, dist.ReduceOp.MIN, group=group)
    dist.all_reduce(hi, dist.ReduceOp.MAX, group=group)
    return bool(torch.equal(lo, hi))


def check_frequencies(rank: int, tp: int, group, vocab: int, temperature: float, n: int) -> dict:
    """Sampled frequencies vs softmax: chi-square per row at the 0.1% level, fixed seeds."""
    full = torch.tensor([[math.log(i + 1.0) for i in range(vocab)],
                         [2.0 * math.sin(i) for i in range(vocab)],
                         [0.0] * vocab], dtype=torch.float32)
    probs = torch.softmax(full / temperature, dim=-1)
    shard = vp.VocabShard(vocab, tp, rank if tp > 1 else 0)
    group_used = group if tp > 1 else None
    local = shard_of(full, shard, pad_value=60.0) if tp > 1 else full
    ids, _ = vp.sample(local, n, shard, group_used, temperature, chunk_size=2,
                       generator=torch.Generator().manual_seed(99 + rank))
    chi, padded = [], int((ids >= vocab).sum() + (ids < 0).sum())
    for row in range(full.shape[0]):
        counts = torch.bincount(ids[row].clamp(0, vocab - 1), minlength=vocab).double()
        expected = probs[row].double() * n
        chi.append(float(((counts - expected) ** 2 / expected).sum()))
    return {"tp": tp, "vocab": vocab, "chi": chi, "bound": chi_square_bound(vocab - 1), "out_of_vocab": padded}


def main() -> None:
    out_dir = sys.argv[1]
    dist.init_process_group("gloo")
    rank, tp = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    report = {"rank": rank, "tp": tp, "exact": [], "freq": []}
    for vocab, temp in ((1000, 1.0), (1001, 0.7), (3, 1.0)):
        report["exact"].append(check_exactness(rank, tp, group, vocab, temp))
    for vocab, temp, tp_used in ((7, 1.0, tp), (7, 1.0, 1), (11, 0.8, tp), (11, 0.8, 1)):
        report["freq"].append(check_frequencies(rank, tp_used, group, vocab, temp, n=6000))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    dist.barrier()  # no rank tears gloo down while a peer is still talking to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
