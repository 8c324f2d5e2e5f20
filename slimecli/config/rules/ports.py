"""The ports counted up from a base (engine k listens on rollout.port + k, node k's teacher on teacher.port + k)
stay ports: a port past 65535 crashes the server that binds it. Each port field's own range is in its spec
(config/port.py); "auto" of a multi-node run is an agreed port (config/layout.py)."""

from __future__ import annotations

from slimecli.config.errors import ConfigError
from slimecli.config.layout import engine_count
from slimecli.config.port import MAX_PORT
from slimecli.config.schema import SlimeConfig


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


RULES = [counted_up]
