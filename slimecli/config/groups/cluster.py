from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from slimecli.config.decode import spec
from slimecli.config.port import MAX_PORT


@dataclass(frozen=True)
class ClusterConfig:
    """Multi-node layout for torchrun; the defaults are one local node. name=slurm: `slimecli train` writes an
    sbatch script that runs the same command on every node of the allocation, and submits it."""

    name: Literal["local", "slurm"] = "local"
    nnodes: int = spec(1, gt=0)  # `cluster.nodes`, SLURM's word for it, is accepted as this key (config/compose.py)
    node_rank: int = spec(0, ge=0)  # below cluster.nnodes (a rule)
    master_addr: str = "127.0.0.1"
    # stays a number: every node must know it before any starts (one node uses torchrun --standalone instead)
    master_port: int = spec(29500, ge=1, le=MAX_PORT, allowed=f"a TCP port in 1..{MAX_PORT}")  # never auto
    # torchrun's rendezvous: static (node ranks as given, the store at master_addr:master_port) or c10d (ranks
    # by arrival, the same endpoint; what elastic launchers use)
    rdzv_backend: Literal["static", "c10d"] = "static"
    # the address of every node, by node rank: where its engines listen and trainer rank 0 reaches them;
    # () = every node at rollout.host (one machine, or engines only on node 0)
    node_hosts: tuple[str, ...] = ()
    # cluster=slurm: the job's #SBATCH settings ("" / 0: left to the cluster's defaults)
    gpus_per_node: int = spec(0, ge=0, note="0: none asked for")
    partition: str = ""
    time: str = ""  # SLURM's time limit: MINUTES, HH:MM:SS, D-HH:MM:SS, ...
    account: str = ""
    sbatch_lines: tuple[str, ...] = ()  # extra lines, e.g. ["--qos=high", "--exclusive"] (#SBATCH added)
