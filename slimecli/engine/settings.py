"""What an engine process serves with: built once, from the run config (`python -m slimecli.engine`) or by a
test, and read as it is for the process's whole life, weight updates included."""

from __future__ import annotations

from dataclasses import dataclass

from slimecli.config.groups.rollout import RolloutConfig
from slimecli.net.listen import MAX_CONNECTIONS
from slimecli.net.server import BODY_TIMEOUT_S


@dataclass(frozen=True)
class EngineSettings:
    model_path: str
    tokenizer_path: str = ""  # empty: the model's directory
    host: str = "127.0.0.1"
    port: int = 30000
    dtype: str = "float32"
    device: str = "auto"  # rollout.device: auto picks the first GPU when there is one
    max_running: int = RolloutConfig.max_running_requests
    seed: int | None = None
    prefix_cache_mb: int = RolloutConfig.prefix_cache_mb  # 0 turns the prefix cache off
    trust_remote_code: bool = False
    log_level: str = "info"
    api_key: str | None = None  # every endpoint but the probes needs it (SGLang's --api-key)
    weight_roots: tuple[str, ...] | None = None  # update_weights_from_disk loads only under these (None: anywhere)
    read_timeout_s: float = BODY_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS
    loopback_loads_anywhere: bool = False  # no roots configured: clients on this host load anywhere, as SGLang

    @property
    def tokenizer(self) -> str:
        return self.tokenizer_path or self.model_path
