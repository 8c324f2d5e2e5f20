"""The control routes' request bodies, one dataclass each: SGLang's ``io_struct`` pattern, decoded by the one
decoder (slimecli.config.decode) that also decodes /generate's sampling parameters and the run's config.

Read from sglang 0.5.23: srt/managers/io_struct.py (the request structs; every one inherits BaseReq's ``rid``
and ``http_worker_ipc``) and srt/entrypoints/http_server.py (which fields each route passes on).

The rules, the same for every control route:
- every field of SGLang's struct for the route is accepted, with SGLang's type and default; what this engine
  does with each is said below: ROUTES[path].ignored lists, with the reason, those it accepts and does not use
  (tests/test_engine_control_bodies.py holds the lists to SGLang's structs, and the SGLang contract test holds
  that copy to SGLang's own code);
- a bad value is a 400 naming the field (`mode: not an allowed value (got 'sideways')`), every problem at once;
- a field SGLang's struct does not have is a 400 naming it, with a did-you-mean (SGLang would drop it in
  silence: `abort_al: true` would abort nothing and answer 200);
- a JSON null is "not given", as in SGLang's bodies.

Where slimecli differs from SGLang's struct it says so in the dataclass: a weight_version may be a number (taken
as its text), and a few values SGLang would accept and this engine cannot honour are refused by name
(a `load_format` that is not a checkpoint directory's, `selector: "draft"`: there is no draft model).

Item 1 of the restart work (health probes, restarting a dead engine) adds its routes here: a dataclass for the
body (or None for a body-less GET, like /health) and an entry in ROUTES with what it ignores.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from aiohttp import web

from slimecli.config.decode import spec
from slimecli.engine.protocol import parse_body
from slimecli.net import server as net

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")

# How /pause_generation pauses (SGLang's PauseGenerationReqInput.mode), and trainer.pause_mode's choices with
# partial rollouts: abort finishes every request with finish_reason abort; retract requeues the running ones,
# which resume from their tokens so far; in_place keeps them, and their keys/values, where they are.
PauseMode = Literal["abort", "retract", "in_place"]
PAUSE_MODES: tuple[PauseMode, ...] = typing.get_args(PauseMode)
Selector = Literal["all", "target", "draft"]  # which model's weights (SGLang: the served one, its draft, both)
GROUP = "weight_update_group"  # SGLang's default group_name
# the 503 of /generate on an engine the supervisor restarted mid-run, until the trainer's weights arrive
AWAITING_WEIGHTS = "this engine was restarted and waits for the trainer's current weights"
MAX_DIM = 1 << 40  # one dimension of a tensor's shape


@dataclass(frozen=True, kw_only=True)
class BaseReq:
    """SGLang's BaseReq: a control request's own id (for tracing) and which HTTP worker it came through."""

    rid: str | None = None
    http_worker_ipc: str | None = None


BASE_IGNORED = {"rid": "the control request's own id, for SGLang's tracing",
                "http_worker_ipc": "which of SGLang's HTTP worker processes sent it (internal routing)"}


@dataclass(frozen=True, kw_only=True)
class AbortReq(BaseReq):
    """/abort_request: the request `rid` names (every copy of an n > 1 request), or all of them."""

    abort_all: bool = False
    finished_reason: dict[str, Any] | None = None
    abort_message: str | None = None
    weight_versions: list[Any] | None = None


@dataclass(frozen=True, kw_only=True)
class PauseGenerationReq(BaseReq):
    """/pause_generation (POST; a GET pauses with the default)."""

    mode: PauseMode = "abort"


@dataclass(frozen=True, kw_only=True)
class ContinueGenerationReq(BaseReq):
    """/continue_generation."""

    torch_empty_cache: bool = True


@dataclass(frozen=True)
class FlushCacheQuery:
    """/flush_cache's query (SGLang's route reads no body): wait up to `timeout` seconds for the running and
    waiting requests to finish before the cache is flushed (0: flush now or answer 400)."""

    timeout: float = spec(0.0, ge=0)


LoadFormat = Literal["auto", "safetensors", "pt"]  # what a checkpoint directory holds; SGLang has many more


@dataclass(frozen=True, kw_only=True)
class UpdateWeightFromDiskReq(BaseReq):
    """/update_weights_from_disk: a checkpoint directory (model_path is checked by slimecli.net.paths)."""

    model_path: str
    load_format: LoadFormat | None = None
    abort_all_requests: bool = False
    weight_version: str | int | None = None
    is_async: bool = False
    torch_empty_cache: bool = False
    keep_pause: bool = False
    recapture_cuda_graph: bool = False
    token_step: int = spec(0, ge=0)
    flush_cache: bool = True
    manifest: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class UpdateWeightVersionReq(BaseReq):
    """/update_weight_version: the weight_version later generations report (a number is taken as its text).
    As in SGLang, it aborts every request unless abort_all_requests is false."""

    new_version: str | int = spec(nonempty=True)
    abort_all_requests: bool = True


@dataclass(frozen=True, kw_only=True)
class LoadLoRAAdapterReq(BaseReq):
    """/load_lora_adapter: a peft adapter directory (lora_path is checked by slimecli.net.paths)."""

    lora_name: str = spec(nonempty=True)
    lora_path: str
    pinned: bool = False
    lora_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class UnloadLoRAAdapterReq(BaseReq):
    """/unload_lora_adapter."""

    lora_name: str = spec(nonempty=True)
    lora_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class InitWeightsUpdateGroupReq(BaseReq):
    """/init_weights_update_group: join the trainer's weight-update process group."""

    master_address: str = spec(nonempty=True)  # the trainer's host
    master_port: int = spec(ge=1, le=65535)
    rank_offset: int = spec(ge=1, note="rank 0 is the trainer")
    world_size: int = spec(ge=2, le=1 << 16, note="the trainer's rank 0 and the engines' ranks")
    group_name: str = spec(GROUP, nonempty=True)
    backend: Literal["nccl", "gloo"] = "nccl"


@dataclass(frozen=True, kw_only=True)
class UpdateWeightsFromDistributedReq(BaseReq):
    """/update_weights_from_distributed: each tensor is broadcast from rank 0 of the group, in the order named."""

    names: list[str] = spec(nonempty=True)
    dtypes: list[str]
    shapes: list[list[int]] = spec(ge=0, lt=MAX_DIM)
    group_name: str = GROUP
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | int | None = None
    load_format: str | None = None  # "flattened_bucket" (one packed tensor) is refused by the route
    selector: Selector = "all"
    torch_empty_cache: bool = False


@dataclass(frozen=True, kw_only=True)
class DestroyWeightsUpdateGroupReq(BaseReq):
    """/destroy_weights_update_group."""

    group_name: str = GROUP


@dataclass(frozen=True, kw_only=True)
class BeginWeightUpdateReq(BaseReq):
    """/begin_weight_update: open the weight-update session update_weights_from_distributed runs in."""

    selector: Selector = "all"


@dataclass(frozen=True, kw_only=True)
class EndWeightUpdateReq(BaseReq):
    """/end_weight_update."""


@dataclass(frozen=True)
class UpdateWeightsFromSharedMemoryReq:
    """/update_weights_from_shared_memory (slimecli's own); the manifest is checked against the segment."""

    tensors: list[dict[str, Any]]  # {name, dtype, shape, offset} each: weight_transfer.parse_manifest
    segment: str = spec(nonempty=True)
    weight_version: str | int | None = None
    flush_cache: bool = True
    abort_all_requests: bool = False
    lora_config: dict[str, Any] | None = None  # given: the tensors are a LoRA adapter (adapters.wire_config)


@dataclass(frozen=True)
class Route:
    """A control route: its body's dataclass (None: no body is read), SGLang's struct for it (None: slimecli's
    own route), and the fields it accepts and does not use, with the reason."""

    body: type[Any] | None
    sglang: str | None
    ignored: dict[str, str]


FLUSH_IGNORED = "the prefix cache is always cleared when new weights land (the old weights' keys/values never " \
                "serve the new ones); requests in flight keep theirs"
EMPTY_CACHE = "torch.cuda.empty_cache() housekeeping after SGLang's own flush; this engine's cache is its own"
ROUTES: dict[str, Route] = {
    "/abort_request": Route(AbortReq, "AbortReq", {
        "finished_reason": "set by SGLang's scheduler when it aborts; its /abort_request passes on only rid and "
                           "abort_all",
        "abort_message": "likewise: the aborted requests finish with this engine's own message",
        "weight_versions": "likewise: the aborted requests report the weight versions they were generated with",
        "http_worker_ipc": BASE_IGNORED["http_worker_ipc"]}),
    "/pause_generation": Route(PauseGenerationReq, "PauseGenerationReqInput", dict(BASE_IGNORED)),
    "/continue_generation": Route(ContinueGenerationReq, "ContinueGenerationReqInput", {
        **BASE_IGNORED, "torch_empty_cache": EMPTY_CACHE}),
    "/flush_cache": Route(None, None, {}),  # SGLang's route reads no body: `?timeout=` only (FlushCacheQuery)
    "/update_weights_from_disk": Route(UpdateWeightFromDiskReq, "UpdateWeightFromDiskReqInput", {
        **BASE_IGNORED,
        "load_format": "auto, safetensors and pt all mean the checkpoint directory as Hugging Face reads it "
                       "(other formats are refused by name)",
        "is_async": "the update is applied between two scheduler steps and answered when it is done",
        "torch_empty_cache": EMPTY_CACHE,
        "keep_pause": "not read by SGLang 0.5.23 either: a successful update leaves a pause as it was",
        "recapture_cuda_graph": "this engine captures no CUDA graphs",
        "token_step": "not read by SGLang 0.5.23's update either (weight_version names the weights)",
        "flush_cache": FLUSH_IGNORED,
        "manifest": "SGLang's tensor metadata for its own loaders; the directory's safetensors are read as they are"}),
    "/update_weight_version": Route(UpdateWeightVersionReq, "UpdateWeightVersionReqInput", dict(BASE_IGNORED)),
    "/load_lora_adapter": Route(LoadLoRAAdapterReq, "LoadLoRAAdapterReqInput", {
        **BASE_IGNORED,
        "pinned": "one adapter is merged into the weights at a time: there is no adapter pool to pin it in",
        "lora_id": "adapters are known by lora_name"}),
    "/unload_lora_adapter": Route(UnloadLoRAAdapterReq, "UnloadLoRAAdapterReqInput", {
        **BASE_IGNORED, "lora_id": "adapters are known by lora_name"}),
    "/init_weights_update_group": Route(InitWeightsUpdateGroupReq, "InitWeightsUpdateGroupReqInput",
                                        dict(BASE_IGNORED)),
    "/update_weights_from_distributed": Route(UpdateWeightsFromDistributedReq, "UpdateWeightsFromDistributedReqInput", {
        **BASE_IGNORED,
        "load_format": "the tensors arrive one by one as named (flattened_bucket, one packed tensor, is refused)",
        "torch_empty_cache": EMPTY_CACHE,
        "flush_cache": FLUSH_IGNORED}),
    "/destroy_weights_update_group": Route(DestroyWeightsUpdateGroupReq, "DestroyWeightsUpdateGroupReqInput",
                                           dict(BASE_IGNORED)),
    "/begin_weight_update": Route(BeginWeightUpdateReq, "BeginWeightUpdateReqInput", dict(BASE_IGNORED)),
    "/end_weight_update": Route(EndWeightUpdateReq, "EndWeightUpdateReqInput", dict(BASE_IGNORED)),
    "/update_weights_from_shared_memory": Route(UpdateWeightsFromSharedMemoryReq, None, {}),
    # GET, no body (SGLang's too): item 1's health probes read these; its restart path goes here with a body
    "/health": Route(None, None, {}),
    "/health_generate": Route(None, None, {}),
}


async def read_body(request: web.Request, cls: type[T], *, required: bool = True) -> T:
    """The request's JSON body decoded as `cls`: 400 naming every bad, missing or unknown field, and the body
    reader's 400/408/413/415 (required=False: an empty body is {}, every field its default)."""
    return parse_body(cls, await net.read_json(request, required, strict_text=True))
