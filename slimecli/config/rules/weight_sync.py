"""trainer.weight_sync against the engines it has to reach."""

from __future__ import annotations

from slimecli.config.errors import ConfigError
from slimecli.config.schema import SlimeConfig

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def weight_sync(cfg: SlimeConfig) -> list[ConfigError]:
    t, r = cfg.trainer, cfg.rollout
    errors = []
    if t.weight_sync == "shared_memory":
        if r.name != "local":
            errors.append(ConfigError("trainer.weight_sync", t.weight_sync,
                                      f"shared_memory is an embedded-engine endpoint; rollout={r.name} lacks it",
                                      "use trainer.weight_sync=nccl (GPU engines) or disk"))
        if r.host not in LOCAL_HOSTS:
            errors.append(ConfigError("trainer.weight_sync", t.weight_sync,
                                      f"shared_memory needs the engines on this host (rollout.host={r.host})",
                                      "use trainer.weight_sync=nccl or disk"))
    return errors


RULES = [weight_sync]
