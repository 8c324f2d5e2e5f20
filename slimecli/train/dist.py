"""torch.distributed set-up for trainer ranks launched by torchrun (gloo on CPU, nccl on GPU)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

_T = TypeVar("_T")


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init(backend: str = "auto", timeout_s: float = 1800.0) -> DistInfo:
    """Join the process group torchrun set up; a plain `python -m` run is a world of one."""
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    if backend == "auto":
        backend = "nccl" if cuda else "gloo"
    device = torch.device(f"cuda:{local_rank}") if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    return DistInfo(rank, world, local_rank, device)


def broadcast_object(obj: _T, src: int = 0) -> _T:
    """Rank `src`'s Python object on every rank (pickled; fine for rollout batches).

    Every rank passes the same expression (its value matters on `src` only), hence one type.
    """
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's Python object, in rank order (pickled; for per-sample log-prob lists)."""
    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_by_data_rank(obj: Any, data_rank: int, data_size: int) -> list[Any]:
    """One object per data rank (model replica), in data-rank order.

    Under tensor or pipeline parallelism several processes hold the same replica; the first one with a
    value (not None: a pipeline stage without the output passes None) speaks for it.
    """
    out: list[Any] = [None] * data_size
    for rank_data, value in all_gather_object((data_rank, obj)):
        if value is not None and out[rank_data] is None:
            out[rank_data] = value
    return out


def collective_device() -> torch.device:
    """Where tensors for collectives must live: NCCL needs the rank's GPU, gloo takes CPU tensors."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(values: dict[str, float]) -> dict[str, float]:
    """Sum scalar metrics over ranks (every rank passes the same keys)."""
    if not dist.is_initialized() or not values:
        return values
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=collective_device())
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist(), strict=True))


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a DistributedDataParallel wrapper (the model itself when it is not wrapped)."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model
