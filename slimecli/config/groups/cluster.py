from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ClusterConfig:
    """Multi-node layout for torchrun; the defaults are one local node."""

    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    # torchrun's rendezvous: static (node ranks as given, the store at master_addr:master_port) or c10d (ranks
    # by arrival, the same endpoint; what elastic launchers use)
    rdzv_backend: Literal["static", "c10d"] = "static"
    # the address of every node, by node rank: where its engines listen and trainer rank 0 reaches them;
    # () = every node at rollout.host (one machine, or engines only on node 0)
    node_hosts: tuple[str, ...] = ()
