"""How a rank's samples split into micro-batches for a forward.

A micro-batch is padded to its longest sample, so the fixed count (trainer.micro_batch_size) pads every short
sample of a long tail to the length of the long one beside it. With trainer.max_tokens_per_micro_batch, samples go
sorted by length into micro-batches of at most that many padded tokens (rows x the longest): the long ones
together, the short ones many to a micro-batch (verl's use_dynamic_bsz, slime's --use-dynamic-batch-size). The
loss is the same either way, up to float rounding: each sample's loss weight is set for the whole update first.
"""

from __future__ import annotations

from collections.abc import Sequence


def micro_batches(lengths: Sequence[int], micro_batch_size: int, max_tokens: int | None) -> list[list[int]]:
    """Positions into ``lengths`` (each sample's padded length: prompt and response tokens), one list per
    micro-batch. With a budget, shortest first, each micro-batch filled while its rows x its longest fit: as few
    micro-batches as any split allows, and the budget's slack left beside the longest samples, not filled with
    short ones padded to them. A sample longer than ``max_tokens`` gets a micro-batch of its own."""
    n = len(lengths)
    if max_tokens is None:
        return [list(range(i, min(i + micro_batch_size, n))) for i in range(0, n, micro_batch_size)]
    out: list[list[int]] = []
    current: list[int] = []
    for i in sorted(range(n), key=lambda i: (lengths[i], i)):
        if current and (len(current) + 1) * lengths[i] > max_tokens:  # i is the longest so far
            out.append(current)
            current = []
        current.append(i)
    if current:
        out.append(current)
    return [sorted(chunk) for chunk in out]


def rank_micro_batches(lengths: Sequence[int], world_size: int, micro_batch_size: int,
                       max_tokens: int | None) -> list[list[list[int]]]:
    """Each data rank's micro-batches of its share (positions rank, rank + world, ... of ``lengths``), as
    positions into ``lengths``; every rank's list is padded with empty micro-batches to the busiest rank's count,
    as FSDP ranks must run the same number of forwards. Every rank computes all of them alike."""
    shares = [list(range(rank, len(lengths), world_size)) for rank in range(world_size)]
    per_rank = [[[share[j] for j in chunk] for chunk in
                 micro_batches([lengths[i] for i in share], micro_batch_size, max_tokens)] for share in shares]
    count = max((len(chunks) for chunks in per_rank), default=0)
    return [chunks + [[] for _ in range(count - len(chunks))] for chunks in per_rank]
