"""torchrun command lines, always through the current interpreter."""

from __future__ import annotations

import sys

from slimecli.config.groups.cluster import ClusterConfig


def torchrun_argv(module: str, args: list[str], nproc: int, cluster: ClusterConfig | None = None) -> list[str]:
    """`python -m torch.distributed.run ... -m module args`.

    One node: a standalone rendezvous on a free local port, so several jobs can share a machine.
    Several nodes: the static master address and port of `cluster`.
    """
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    if cluster is None or cluster.nnodes == 1:
        argv += ["--standalone", "--nnodes", "1"]
    else:
        argv += ["--nnodes", str(cluster.nnodes), "--node-rank", str(cluster.node_rank),
                 "--master-addr", cluster.master_addr, "--master-port", str(cluster.master_port)]
    return argv + ["-m", module, *args]
