from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from slimecli.config.port import Port, port_field


@dataclass(frozen=True)
class TeacherConfig:
    """A teacher that scores student tokens: none, slimecli's teacher server, or SGLang."""

    name: Literal["none", "server", "sglang"] = "none"
    url: str | None = None  # an existing server; otherwise launched from model_path
    model_path: str | None = None
    host: str = "127.0.0.1"
    port: Port = port_field()  # auto: a free port when the server starts (recorded in RUN/plan.json)
    # a launched teacher server (tp x dp ranks) on every node of the run, node k's on teacher.port + k at its
    # address (cluster.node_hosts); trainer rank 0 spreads its samples over all of them
    every_node: bool = False
    tp: int = 1
    dp: int = 1
    # torch: the model body replicated on every rank, the output layer split by vocabulary;
    # megatron: the whole model tensor-parallel through megatron-core (each rank holds ~1/tp of the weights).
    backend: Literal["torch", "megatron"] = "torch"
    temperature: float = 1.0
    max_length: int = 0  # 0 = no limit
    warmup: bool = True
    warmup_timeout_s: float = 3000.0
    update_timeout_s: float = 3600.0
    start_timeout_s: float = 600.0
    sample_chunk_size: int = 4096
    label_chunk_size: int = 4096
    api_key: str | None = None
    # update_weights_from_disk loads only from under these directories; empty: the directory holding the
    # teacher's first checkpoint (its siblings are its updates) and the run directory
    weight_roots: tuple[str, ...] = ()
    concurrency: int = 8
    max_retries: int = 3
    request_timeout_s: float = 600.0
    seed: int = 0  # sampling RNG of the server (per rank: seed + 1009 * dp_index + tp_rank)
    log_interval_s: float = 5.0  # load line (queue / running / requests/s / tokens/s) while busy
    dtype: str | None = None  # weights' dtype on the server; None = model.dtype
    keepalive_s: float = 30.0  # idle ranks get a no-op message this often, far below the collective timeout
