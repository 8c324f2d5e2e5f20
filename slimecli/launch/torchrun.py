"""How rank processes are started: under torchrun, always through the current interpreter, or alone."""

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


# What torchrun gives rank 0 of a world of one. MASTER_PORT=0: the process's own store binds a free port (nobody
# else joins it), so nothing is reserved ahead.
WORLD_OF_ONE = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}


def rank_command(module: str, args: list[str], nproc: int, cluster: ClusterConfig | None = None,
                 run_id: str = "slimecli", preload: tuple[str, ...] = ()) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of the ranks' process: torchrun across nodes; on one node slimecli.launch.ranks (the
    ranks forked from one process that imported torch once), or for one process the module itself.

    On one node torchrun's agent restarts nothing and its rendezvous has nobody to wait for, but it costs a
    Python start with torch imported (about 2 CPU-seconds) in every run, and each rank it starts imports torch
    and transformers again."""
    if cluster is None or cluster.nnodes == 1:
        if nproc == 1:
            return [sys.executable, "-m", module, *args], dict(WORLD_OF_ONE)
        more = ["--preload", ",".join(preload)] if preload else []
        return [sys.executable, "-m", "slimecli.launch.ranks", "--nproc", str(nproc), *more, "-m", module, *args], {}
    return torchrun_argv(module, args, nproc, cluster, run_id), {}
