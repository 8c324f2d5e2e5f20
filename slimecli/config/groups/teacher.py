from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from slimecli.config.decode import spec
from slimecli.config.groups.model import Dtype
from slimecli.config.port import Port, port_field

TeacherKind = Literal["server", "sglang"]


@dataclass(frozen=True)
class TeacherSettings:
    """What a teacher is and how it is served: the fields the `teacher` group and each `teachers` entry share
    (one place for their defaults and bounds). ``name`` is the group member there, the teacher's label here."""

    name: str = "none"
    url: str | None = None  # an existing server; otherwise launched from model_path
    model_path: str | None = None
    host: str = spec("127.0.0.1", resumable=True)
    port: Port = port_field()  # auto: a free port when the server starts (recorded in RUN/plan.json)
    # a launched teacher server (tp x dp ranks) on every node of the run, node k's on teacher.port + k at its
    # address (cluster.node_hosts); trainer rank 0 spreads its samples over all of them
    every_node: bool = False
    tp: int = spec(1, gt=0)
    dp: int = spec(1, gt=0)
    # torch: the model body replicated on every rank, the output layer split by vocabulary;
    # megatron: the whole model tensor-parallel through megatron-core (each rank holds ~1/tp of the weights).
    backend: Literal["torch", "megatron"] = "torch"
    temperature: float = spec(1.0, gt=0)
    max_length: int = spec(0, ge=0, note="0 = no limit")
    warmup: bool = True
    warmup_timeout_s: float = spec(3000.0, gt=0, resumable=True)
    update_timeout_s: float = spec(3600.0, gt=0, resumable=True)
    start_timeout_s: float = spec(600.0, gt=0, resumable=True)
    # a launched teacher server that dies, or answers no /healthz for health_timeout_s (hung), is killed and
    # restarted (stacks dumped first), at most max_restarts times in a run; its clients wait for it meanwhile
    max_restarts: int = spec(2, ge=0, note="0: a dead teacher stops the run", resumable=True)
    health_interval_s: float = spec(10.0, gt=0, resumable=True)
    health_timeout_s: float = spec(120.0, gt=0, resumable=True)
    health_start_grace_s: float = spec(60.0, ge=0, note="after a (re)start, before a failing probe counts",
                                       resumable=True)
    sample_chunk_size: int = spec(4096, gt=0)
    label_chunk_size: int = spec(4096, gt=0)
    api_key: str | None = None
    # update_weights_from_disk loads only from under these directories; empty: the directory holding the
    # teacher's first checkpoint (its siblings are its updates) and the run directory
    weight_roots: tuple[str, ...] = ()
    concurrency: int = spec(8, gt=0)
    max_retries: int = spec(3, ge=0)
    request_timeout_s: float = spec(600.0, gt=0, resumable=True)
    seed: int = spec(0, note="any 64-bit int seeds torch")  # sampling RNG of the server (per rank: seed + 1009 * dp_index + tp_rank)
    # load line (queue / running / requests/s / tokens/s) while busy
    log_interval_s: float = spec(5.0, gt=0, resumable=True)
    dtype: Dtype | None = None  # weights' dtype on the server; None = model.dtype
    keepalive_s: float = spec(30.0, gt=0)  # idle ranks get a no-op message this often, far below the collective timeout


@dataclass(frozen=True)
class TeacherConfig(TeacherSettings):
    """A teacher that scores student tokens: none, slimecli's teacher server, or SGLang."""

    name: Literal["none", "server", "sglang"] = "none"


@dataclass(frozen=True)
class TeacherEntry(TeacherSettings):
    """One of several teachers (the top-level `teachers` list): its label, what it is (`kind`, as `teacher=KIND`
    picks for the one teacher of the `teacher` group) and its own distillation strength."""

    name: str = spec("", nonempty=True)  # its label: teacher_routes and teacher_default name it; teacher/<name>/...
    kind: TeacherKind = "server"
    opd_kl_coef: float | None = spec(None, ge=0, note="null: trainer.opd_kl_coef")
