"""What trainer and engine agree on to move weights without a checkpoint on disk.

Two transports, each one shared by both sides:

- a **shared-memory segment** (a file on the host's tmpfs, ``/dev/shm``) that the trainer fills with the
  state dict and the co-located engine copies from; the request carries a manifest of where each tensor
  lies. slimecli's own extension of the engine API (SGLang engines do not have it).
- a **weight-update process group**: SGLang's ``/init_weights_update_group`` +
  ``/update_weights_from_distributed`` protocol. The trainer's rank 0 is rank 0 of a separate group that
  every engine rank joins (rank_offset + its TP rank); each tensor is broadcast from rank 0. The group is
  built the way SGLang builds it (a TCP rendezvous, a store prefixed by the group name, torch's own group
  constructor), so either side can be SGLang. NCCL on GPUs; gloo serves the same protocol on a CPU.
"""

from __future__ import annotations

import math
import mmap
import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import torch

from slimecli.engine.shm import segment_path

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
    "int64": torch.int64, "int32": torch.int32, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}
_ALIGN = 64  # every tensor starts on a cache line


def dtype_name(dtype: torch.dtype) -> str:
    for name, d in DTYPES.items():
        if d == dtype:
            return name
    raise ValueError(f"dtype {dtype} cannot be sent (allowed: {', '.join(DTYPES)})")


def parse_dtype(name: object, field: str) -> torch.dtype:
    if isinstance(name, str) and name.removeprefix("torch.") in DTYPES:
        return DTYPES[name.removeprefix("torch.")]
    raise ValueError(f"{field}: {name!r} is not a dtype (allowed: {', '.join(DTYPES)})")


def parse_shape(shape: object, field: str) -> list[int]:
    if (not isinstance(shape, list) or len(shape) > 8
            or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40 for d in shape)):
        raise ValueError(f"{field}: must be a list of at most 8 non-negative integers")
    return shape


# ---- shared memory --------------------------------------------------------------------------------
class SlotJson(TypedDict):
    """One entry of a shared-memory push's ``tensors`` manifest, as the request carries it."""

    name: str
    dtype: str  # a DTYPES key
    shape: list[int]
    offset: int  # bytes from the segment's start, a multiple of 64


@dataclass(frozen=True)
class TensorSlot:
    name: str
    dtype: torch.dtype
    shape: list[int]
    offset: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()

    def to_json(self) -> SlotJson:
        return {"name": self.name, "dtype": dtype_name(self.dtype), "shape": self.shape, "offset": self.offset}


def layout(entries: Iterable[tuple[str, torch.dtype, list[int]]]) -> tuple[list[TensorSlot], int]:
    """Where each (name, dtype, shape) goes in the segment, and the segment's size."""
    slots, offset = [], 0
    for name, dtype, shape in entries:
        slot = TensorSlot(name, dtype, list(shape), offset)
        slots.append(slot)
        offset += -(-slot.nbytes // _ALIGN) * _ALIGN
    return slots, max(offset, _ALIGN)


def parse_manifest(raw: object, size: int) -> list[TensorSlot]:
    """The request's ``tensors`` list, checked against the segment's size; ValueError names the entry."""
    if not isinstance(raw, list) or not raw:
        raise ValueError("tensors: must be a non-empty list of {name, dtype, shape, offset}")
    slots, seen = [], set()
    for i, entry in enumerate(raw):
        where = f"tensors[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"name", "dtype", "shape", "offset"}:
            raise ValueError(f"{where}: must be an object with exactly name, dtype, shape, offset")
        name, offset = entry["name"], entry["offset"]
        if not isinstance(name, str) or not name or len(name) > 1000 or name in seen:
            raise ValueError(f"{where}.name: must be a new non-empty string")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0 or offset % _ALIGN:
            raise ValueError(f"{where}.offset: must be a non-negative multiple of {_ALIGN}")
        slot = TensorSlot(name, parse_dtype(entry["dtype"], f"{where}.dtype"),
                          parse_shape(entry["shape"], f"{where}.shape"), offset)
        if slot.offset + slot.nbytes > size:
            raise ValueError(f"{where}: bytes {slot.offset}..{slot.offset + slot.nbytes} lie beyond the "
                             f"segment's {size} bytes")
        seen.add(name)
        slots.append(slot)
    return slots


class SharedSegment:
    """A tmpfs file mapped into this process; the trainer writes tensors, the engine reads them."""

    def __init__(self, path: Path, size: int, create: bool) -> None:
        self.path, self.size = path, size
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            elif os.fstat(fd).st_size < size:
                raise ValueError(f"segment {path.name} holds {os.fstat(fd).st_size} bytes, fewer than {size}")
            self._map = mmap.mmap(fd, size, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._bytes = torch.frombuffer(self._map, dtype=torch.uint8)

    @classmethod
    def open(cls, name: object) -> SharedSegment:
        path = segment_path(name)
        if not path.is_file():
            raise FileNotFoundError(f"segment: no shared-memory segment {path.name}")
        return cls(path, path.stat().st_size, create=False)

    @property
    def address(self) -> int:
        """Where the mapping starts in this process."""
        return int(self._bytes.data_ptr())

    def view(self, slot: TensorSlot) -> torch.Tensor:
        raw = self._bytes[slot.offset:slot.offset + slot.nbytes]
        return raw.view(slot.dtype).view(slot.shape)

    def close(self, unlink: bool = False) -> None:
        """Unmap (once no tensor views it any more: a view still in use keeps the mapping alive)."""
        self._bytes = torch.empty(0, dtype=torch.uint8)
        try:
            self._map.close()
        except BufferError:
            pass  # views remain (a model still serving from it); the mapping goes with the last of them
        if unlink:
            self.path.unlink(missing_ok=True)


# ---- the weight-update process group --------------------------------------------------------------
def init_weight_group(backend: str, master_address: str, master_port: int, world_size: int, rank: int,
                      group_name: str, timeout_s: float = 300.0) -> ProcessGroup:
    """Join a new process group beside (not instead of) any default group, as SGLang's engines do."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    timeout = timedelta(seconds=timeout_s)
    # What rendezvous("tcp://...") builds, made directly: under torchrun, rendezvous would join the elastic
    # agent's store instead of hosting this group's own (TORCHELASTIC_USE_AGENT_STORE) and nobody could join.
    store = dist.TCPStore(master_address, master_port, world_size, is_master=rank == 0, timeout=timeout)
    prefixed = c10d.PrefixStore(group_name, store)
    group: ProcessGroup
    group, _ = c10d._new_process_group_helper(world_size, rank, [], c10d.Backend(backend), prefixed,
                                              group_name=c10d.GroupName(group_name), timeout=timeout)
    c10d._world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group


def destroy_weight_group(group: ProcessGroup) -> None:
    import torch.distributed as dist

    dist.destroy_process_group(group)
