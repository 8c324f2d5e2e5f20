"""Where a run's processes live across nodes: which engines each node serves, and where every node keeps its
own files inside the shared run directory. A pure function of the frozen config, so every process that reads
it (controllers, engines, trainer rank 0, evaluators) agrees on the same layout without talking."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from slimecli.config.schema import SlimeConfig

NODES_DIR = "nodes"  # RUN/nodes/<rank>/: the config, logs, plan and lock of node <rank> > 0


@dataclass(frozen=True)
class EngineSlot:
    index: int  # engine-<index>: the run's engines numbered over every node
    node: int  # the node rank that starts it
    host: str  # the address it listens on, and where trainer rank 0 reaches it
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def node_host(cfg: SlimeConfig, node: int) -> str:
    """The address of node ``node``: cluster.node_hosts when given, else rollout.host (every node on one host)."""
    hosts = cfg.cluster.node_hosts
    return hosts[node] if node < len(hosts) else cfg.rollout.host


def engine_slots(cfg: SlimeConfig) -> list[EngineSlot]:
    """Every engine of the run. rollout.engines_per_node = 0: rollout.num_engines engines on node 0; N > 0: N
    engines on every node. Engine k listens on rollout.port + k, so nodes sharing a host never collide."""
    r = cfg.rollout
    if r.engines_per_node == 0:
        return [EngineSlot(i, 0, node_host(cfg, 0), r.port + i) for i in range(r.num_engines)]
    return [EngineSlot(k, k // r.engines_per_node, node_host(cfg, k // r.engines_per_node), r.port + k)
            for k in range(cfg.cluster.nnodes * r.engines_per_node)]


def node_engines(cfg: SlimeConfig) -> list[EngineSlot]:
    """The engines this node (cluster.node_rank) starts."""
    return [slot for slot in engine_slots(cfg) if slot.node == cfg.cluster.node_rank]


def engine_slot(cfg: SlimeConfig, index: int) -> EngineSlot:
    """Engine ``index`` of the layout; an index past it (an engine started by hand, `--index i`) listens on
    rollout.port + index at rollout.host."""
    slots = engine_slots(cfg)
    return slots[index] if 0 <= index < len(slots) else EngineSlot(index, 0, cfg.rollout.host, cfg.rollout.port + index)


def node_dir(run_dir: Path, node_rank: int) -> Path:
    """Where node ``node_rank`` keeps its config, logs, plan and lock: the run directory itself for node 0."""
    return run_dir if node_rank == 0 else run_dir / NODES_DIR / str(node_rank)


def run_dir_of(config_path: str | Path) -> Path:
    """The shared run directory of a frozen config file, whichever node's copy it is."""
    parent = Path(config_path).resolve().parent
    return parent.parent.parent if parent.parent.name == NODES_DIR else parent
