"""Where a run's processes live across nodes: which engines and teacher servers each node serves, and where
every node keeps its own files inside the shared run directory. A pure function of the frozen config, so every
process that reads it (controllers, engines, trainer rank 0, evaluators) agrees on the same layout without
talking."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from slimecli.config.groups.reward import JUDGE_EMBEDDED, RewardConfig
from slimecli.config.port import Port
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


# "auto" on a multi-node run: the nodes start apart and must agree on their servers' ports without talking, so
# auto there is this agreed base port (engine k on 30000 + k, node k's teacher on 7999 + k), checked for "in use"
# before launch like a port given by hand.
MULTI_NODE_PORTS = {"rollout.port": 30000, "teacher.port": 7999}


def layout_port(cfg: SlimeConfig, key: str) -> Port:
    """rollout.port or teacher.port as the layout reads it: "auto" of a multi-node run is its agreed port."""
    value = cfg.rollout.port if key == "rollout.port" else cfg.teacher.port
    return MULTI_NODE_PORTS[key] if value == "auto" and cfg.cluster.nnodes > 1 else value


def picked(port: Port, key: str) -> int:
    """A port of the layout as a number: an "auto" one must have been picked first (launch/free_ports.py)."""
    if isinstance(port, int):
        return port
    raise ValueError(f"{key}={port}: no port picked yet (slimecli.launch.free_ports.with_free_ports picks them)")


def node_host(cfg: SlimeConfig, node: int) -> str:
    """The address of node ``node``: cluster.node_hosts when given, else rollout.host (every node on one host)."""
    hosts = cfg.cluster.node_hosts
    return hosts[node] if node < len(hosts) else cfg.rollout.host


def engine_count(cfg: SlimeConfig) -> int:
    """How many engines the run has over all its nodes (engine_slots without their addresses)."""
    r = cfg.rollout
    return r.num_engines if r.engines_per_node == 0 else cfg.cluster.nnodes * r.engines_per_node


def engine_slots(cfg: SlimeConfig) -> list[EngineSlot]:
    """Every engine of the run. rollout.engines_per_node = 0: rollout.num_engines engines on node 0; N > 0: N
    engines on every node. Engine k listens on rollout.port + k, so nodes sharing a host never collide."""
    r = cfg.rollout
    if r.engines_per_node == 0:
        return [EngineSlot(i, 0, node_host(cfg, 0), picked(layout_port(cfg, "rollout.port"), "rollout.port") + i) for i in range(r.num_engines)]
    return [EngineSlot(k, k // r.engines_per_node, node_host(cfg, k // r.engines_per_node),
                       picked(layout_port(cfg, "rollout.port"), "rollout.port") + k) for k in range(cfg.cluster.nnodes * r.engines_per_node)]


def node_engines(cfg: SlimeConfig) -> list[EngineSlot]:
    """The engines this node (cluster.node_rank) starts."""
    return [slot for slot in engine_slots(cfg) if slot.node == cfg.cluster.node_rank]


def engine_slot(cfg: SlimeConfig, index: int) -> EngineSlot:
    """Engine ``index`` of the layout; an index past it (an engine started by hand, `--index i`) listens on
    rollout.port + index at rollout.host."""
    slots = engine_slots(cfg)
    if 0 <= index < len(slots):
        return slots[index]
    return EngineSlot(index, 0, cfg.rollout.host, picked(layout_port(cfg, "rollout.port"), "rollout.port") + index)


def teacher_address(cfg: SlimeConfig, node: int) -> tuple[str, int]:
    """Where node ``node``'s teacher server listens: teacher.host:teacher.port, or with teacher.every_node the
    node's address (cluster.node_hosts, else teacher.host) on teacher.port + node."""
    t = cfg.teacher
    port = picked(layout_port(cfg, "teacher.port"), "teacher.port")
    if not t.every_node:
        return t.host, port
    hosts = cfg.cluster.node_hosts
    return (hosts[node] if node < len(hosts) else t.host), port + node


def teacher_nodes(cfg: SlimeConfig) -> list[int]:
    """The nodes that start a teacher server: none for teacher.url (it runs already), node 0, or every node."""
    if cfg.teacher.name != "server" or cfg.teacher.url:
        return []
    return list(range(cfg.cluster.nnodes)) if cfg.teacher.every_node else [0]


def teacher_urls(cfg: SlimeConfig) -> list[str]:
    """The teacher servers trainer rank 0 sends its samples to."""
    if cfg.teacher.url:
        return [cfg.teacher.url.rstrip("/")]
    addresses = [teacher_address(cfg, n) for n in teacher_nodes(cfg) or [0]]
    return [f"http://{reachable_host(host)}:{port}" for host, port in addresses]


def embedded_judge(cfg: SlimeConfig) -> RewardConfig | None:
    """The reward settings of the judge the run starts itself (reward.judge_url=embedded), on node 0, when the
    run's reward or an eval dataset's is reward=judge with it; else None."""
    from slimecli.config.eval_settings import dataset_reward

    if cfg.cluster.node_rank != 0:
        return None
    for reward in (cfg.reward, *(dataset_reward(ds, cfg.reward) for ds in cfg.eval.datasets if ds.env is None)):
        if reward.name == "judge" and reward.judge_url == JUDGE_EMBEDDED:
            return reward
    return None


def reachable_host(host: str) -> str:
    """A wildcard listen address is reached on loopback."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def node_dir(run_dir: Path, node_rank: int) -> Path:
    """Where node ``node_rank`` keeps its config, logs, plan and lock: the run directory itself for node 0."""
    return run_dir if node_rank == 0 else run_dir / NODES_DIR / str(node_rank)


def run_dir_of(config_path: str | Path) -> Path:
    """The shared run directory of a frozen config file, whichever node's copy it is."""
    parent = Path(config_path).resolve().parent
    return parent.parent.parent if parent.parent.name == NODES_DIR else parent
