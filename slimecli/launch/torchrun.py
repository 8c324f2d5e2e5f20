"""torchrun command lines, always through the current interpreter."""

from __future__ import annotations

import sys

from slimecli.config.groups.cluster import ClusterConfig


def torchrun_argv(module: str, args: list[str], nproc: int, cluster: ClusterConfig | None = None,
                  run_id: str = "slimecli") -> list[str]:
    """`python -m torch.distributed.run ... -m module args`.

    One node: a standalone rendezvous on a free local port, so several jobs can share a machine.
    Several nodes: torchrun's rendezvous at cluster.master_addr:master_port, static (this node's rank as given)
    or c10d (ranks by arrival, under ``run_id``). Either way no restarts: a node that fails ends the run on
    every node, and the same command on every node resumes it.
    """
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    if cluster is None or cluster.nnodes == 1:
        argv += ["--standalone", "--nnodes", "1"]
    elif cluster.rdzv_backend == "c10d":
        argv += ["--nnodes", str(cluster.nnodes), "--rdzv-backend", "c10d", "--rdzv-id", run_id,
                 "--rdzv-endpoint", f"{cluster.master_addr}:{cluster.master_port}", "--max-restarts", "0"]
    else:
        argv += ["--nnodes", str(cluster.nnodes), "--node-rank", str(cluster.node_rank),
                 "--master-addr", cluster.master_addr, "--master-port", str(cluster.master_port)]
    return argv + ["-m", module, *args]
