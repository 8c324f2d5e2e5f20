"""Every TCP port of the schema is "auto" or in range, with the ports counted up from it (engine k listens on
rollout.port + k, node k's teacher on teacher.port + k): a port past 65535 passes the type check and then
crashes the server that binds it. "auto" of a multi-node run is an agreed port (config/layout.py)."""

from __future__ import annotations

from slimecli.config.errors import ConfigError
from slimecli.config.layout import engine_count
from slimecli.config.port import MAX_PORT, PORT_ALLOWED, is_auto
from slimecli.config.schema import SlimeConfig

# Each port field of the schema (a leaf named `port` or `*_port`) and whether 0 is allowed: agent.port=0 is the
# older spelling of auto (the adapter reports the port it got). cluster.master_port is never auto (its comment).
PORT_FIELDS = {"rollout.port": False, "teacher.port": False, "agent.port": True, "cluster.master_port": False}


def is_port_key(path: str) -> bool:
    leaf = path.rsplit(".", 1)[-1]
    return leaf == "port" or leaf.endswith("_port")


def _value(cfg: SlimeConfig, path: str) -> object:
    node: object = cfg
    for part in path.split("."):
        node = getattr(node, part)
    return node


def in_range(cfg: SlimeConfig) -> list[ConfigError]:
    errors = []
    for path, zero_allowed in PORT_FIELDS.items():
        port = _value(cfg, path)
        if is_auto(port) and path != "cluster.master_port":
            continue
        low = 0 if zero_allowed else 1
        if isinstance(port, bool) or not isinstance(port, int) or not low <= port <= MAX_PORT:
            errors.append(ConfigError(path, port, f"must be {_allowed(path, zero_allowed)}"))
    return errors


def _allowed(path: str, zero_allowed: bool) -> str:
    if path == "cluster.master_port":
        return f"a TCP port in 1..{MAX_PORT}"
    return f"{PORT_ALLOWED} (or 0, the same as auto)" if zero_allowed else PORT_ALLOWED


def counted_up(cfg: SlimeConfig) -> list[ConfigError]:
    """The last engine's and the last node's teacher port must still be a port."""
    errors = []
    r, t, nnodes = cfg.rollout, cfg.teacher, cfg.cluster.nnodes
    engines = engine_count(cfg)
    if isinstance(r.port, int) and 0 < r.port <= MAX_PORT and engines > 0 and r.port + engines - 1 > MAX_PORT:
        errors.append(ConfigError("rollout.port", r.port, f"engine k listens on rollout.port + k: the last of "
                                  f"{engines} engines would listen on {r.port + engines - 1}, past {MAX_PORT}",
                                  f"use rollout.port <= {MAX_PORT - engines + 1}"))
    if (t.every_node and isinstance(t.port, int) and 0 < t.port <= MAX_PORT and nnodes > 1
            and t.port + nnodes - 1 > MAX_PORT):
        errors.append(ConfigError("teacher.port", t.port, f"node k's teacher listens on teacher.port + k: node "
                                  f"{nnodes - 1}'s would listen on {t.port + nnodes - 1}, past {MAX_PORT}",
                                  f"use teacher.port <= {MAX_PORT - nnodes + 1}"))
    return errors


RULES = [in_range, counted_up]
