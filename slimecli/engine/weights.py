"""The engine's weight updates that bypass the disk: from a shared-memory segment, and SGLang's
weight-update process group (``/init_weights_update_group``, ``/update_weights_from_distributed``,
``/destroy_weights_update_group``).

As in SGLang since its weight-update sessions (mid-2026), ``/update_weights_from_distributed`` runs only
between ``POST /begin_weight_update`` and ``POST /end_weight_update``; outside a session it answers
success=false before it joins any broadcast, so a client finds its mistake at once.

New tensors are copied into the served model in place on the scheduler thread, between two steps, so a
request never sees half-updated weights; the prefix cache is cleared with them, as on a disk update.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import TYPE_CHECKING, Any

import torch
from aiohttp import web

from slimecli.engine.bodies import (
    BeginWeightUpdateReq,
    DestroyWeightsUpdateGroupReq,
    EndWeightUpdateReq,
    InitWeightsUpdateGroupReq,
    Selector,
    UpdateWeightsFromDistributedReq,
    UpdateWeightsFromSharedMemoryReq,
    read_body,
)
from slimecli.engine.core import EngineCore, Install, installer
from slimecli.engine.protocol import BadRequest
from slimecli.engine.weight_transfer import (
    SharedSegment,
    destroy_weight_group,
    init_weight_group,
    parse_dtype,
    parse_manifest,
    parse_shape,
)

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

log = logging.getLogger("slimecli.engine")
GROUP_TIMEOUT_S = 300.0
MAX_ADDRESS = 255  # characters of a host name
MAX_GROUP_NAME = 200


def check_targets(model: Any, items: list[tuple[str, torch.dtype, list[int]]]) -> dict[str, torch.Tensor]:
    """The served tensors these names overwrite; BadRequest names the first that does not fit."""
    targets = model.state_dict(keep_vars=True)
    out: dict[str, torch.Tensor] = {}
    for name, dtype, shape in items:
        target = targets.get(name)
        if target is None:
            raise BadRequest(f"names: {name!r} is not a tensor of the served model")
        if list(target.shape) != shape:
            raise BadRequest(f"shapes: {name!r} is {list(target.shape)} in the served model, not {shape}")
        if target.is_floating_point() != dtype.is_floating_point:
            raise BadRequest(f"dtypes: {name!r} is {target.dtype} in the served model, not {dtype}")
        out[name] = target
    return out


class WeightRoutes:
    """Handlers for one EngineCore (its scheduler, update lock and readiness)."""

    def __init__(self, server: EngineCore) -> None:
        self.server = server
        self.groups: dict[str, ProcessGroup] = {}  # SGLang's weight-update groups, by group_name
        self.segment: SharedSegment | None = None  # the one the served tensors are views of, if any
        self.session_open = False  # between /begin_weight_update and /end_weight_update
        from slimecli.engine.adapters import AdapterRoutes

        self.lora = AdapterRoutes(server)  # LoRA adapters (SGLang's /load_lora_adapter), merged into the weights

    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_post("/update_weights_from_shared_memory", self.from_shared_memory)
        router.add_post("/init_weights_update_group", self.init_group)
        router.add_post("/update_weights_from_distributed", self.from_distributed)
        router.add_post("/destroy_weights_update_group", self.destroy_group)
        router.add_post("/begin_weight_update", self.begin_session)
        router.add_post("/end_weight_update", self.end_session)
        self.lora.add_to(router)

    # ---- the weight-update session (SGLang's) -------------------------------------------------
    async def begin_session(self, request: web.Request) -> web.Response:
        """SGLang's ``{"selector"?: "all" | "target" | "draft"}``: one session at a time."""
        body = await read_body(request, BeginWeightUpdateReq, required=False)
        check_selector(body.selector)
        if self.session_open:
            return _refused("a weight-update session is already open (POST /end_weight_update first)", 409)
        self.session_open = True
        return web.json_response({"success": True, "message": "Success"})

    async def end_session(self, request: web.Request) -> web.Response:
        await read_body(request, EndWeightUpdateReq, required=False)
        if not self.session_open:
            return _refused("no weight-update session is open (POST /begin_weight_update first)", 409)
        self.session_open = False
        return web.json_response({"success": True, "message": "Success"})

    # ---- shared memory ----------------------------------------------------------------------
    async def from_shared_memory(self, request: web.Request) -> web.Response:
        """``{"segment", "tensors": [{name, dtype, shape, offset}], "weight_version"?, "abort_all_requests"?}``

        A CPU engine serves straight from the segment afterwards (its tensors become views of it); the
        trainer then writes each new version into the same segment while this engine is paused and flushed.
        """
        body = await read_body(request, UpdateWeightsFromSharedMemoryReq)
        version = _text(body.weight_version)
        if body.lora_config is not None:
            return await self._adapter_from_shared_memory(body, body.lora_config, version)
        reuse = self.segment is not None and self.segment.path.name == body.segment
        try:
            segment = self.segment if reuse and self.segment is not None else SharedSegment.open(body.segment)
            slots = parse_manifest(body.tensors, segment.size)
        except (ValueError, FileNotFoundError) as exc:
            raise BadRequest(str(exc)) from None
        try:
            targets = check_targets(self.server._sched.runner.model, [(s.name, s.dtype, s.shape) for s in slots])
            sources = {s.name: segment.view(s) for s in slots}
            paused = await self._apply(installer(targets, sources, bind=True), version, body.abort_all_requests)
        except BaseException:
            if not reuse:
                segment.close()
            raise
        if not reuse:
            previous, self.segment = self.segment, segment
            if previous is not None:
                previous.close()  # nothing serves from it any more
        log.info("weights updated from shared memory %s (%d tensors, weight_version=%s)",
                 segment.path.name, len(slots), self.server._sched.weight_version)
        return web.json_response({"success": True, "message": "Succeeded to update model weights.",
                                  "num_paused_requests": paused})

    async def _adapter_from_shared_memory(self, body: UpdateWeightsFromSharedMemoryReq, lora_config: dict[str, Any],
                                          version: str | None) -> web.Response:
        """``lora_config`` given: the segment holds a LoRA adapter (peft's names), merged onto the base weights."""
        from slimecli.engine.adapters import wire_config

        config = wire_config(lora_config)
        try:
            segment = SharedSegment.open(body.segment)
        except (ValueError, FileNotFoundError) as exc:
            raise BadRequest(str(exc)) from None
        try:
            slots = parse_manifest(body.tensors, segment.size)
            if body.abort_all_requests:
                sch = self.server._sched
                await asyncio.wrap_future(sch.call(lambda: sch.abort(lambda s: True, "Aborted: weight update.")))
            await self.lora.merge(config, {s.name: segment.view(s) for s in slots}, f"shm-v{version}", version)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        finally:
            segment.close()  # the merged weights are copies: nothing serves from the segment
        log.info("LoRA adapter merged from shared memory %s (%d tensors, weight_version=%s)",
                 segment.path.name, len(slots), self.server._sched.weight_version)
        return web.json_response({"success": True, "message": "Succeeded to update model weights.",
                                  "num_paused_requests": 0})

    # ---- the weight-update process group ----------------------------------------------------
    async def init_group(self, request: web.Request) -> web.Response:
        """SGLang's ``{"master_address", "master_port", "rank_offset", "world_size", "group_name", "backend"}``."""
        body = await read_body(request, InitWeightsUpdateGroupReq)
        address, port, offset, world = body.master_address, body.master_port, body.rank_offset, body.world_size
        name, backend = body.group_name, body.backend
        if len(address) > MAX_ADDRESS:
            raise BadRequest(f"master_address: longer than {MAX_ADDRESS} characters ({len(address)})")
        if offset >= world:
            raise BadRequest(f"rank_offset: must be in 1..{world - 1} (rank 0 is the trainer; world_size={world})")
        if len(name) > MAX_GROUP_NAME:
            raise BadRequest(f"group_name: longer than {MAX_GROUP_NAME} characters ({len(name)})")
        if backend == "nccl" and not str(self.server.device).startswith("cuda"):
            raise BadRequest(f"backend: nccl needs an engine on a GPU; this one runs on {self.server.device} "
                             "(use gloo)")
        if name in self.groups:
            raise BadRequest(f"group_name: {name!r} already exists (destroy it first)")
        try:
            self.groups[name] = await asyncio.to_thread(init_weight_group, backend, address, port, world, offset,
                                                        name, GROUP_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - a failed rendezvous is the caller's to see, not a crash
            log.warning("init_weights_update_group %s failed: %s", name, exc)
            return web.json_response({"success": False, "message": f"Failed to join {name}: {exc}"}, status=400)
        log.info("joined weight-update group %s as rank %d of %d (%s)", name, offset, world, backend)
        return web.json_response({"success": True, "message": "Succeeded to initialize custom process group."})

    async def from_distributed(self, request: web.Request) -> web.Response:
        """SGLang's ``{"names", "dtypes", "shapes", "group_name", "weight_version"?, ...}``: each tensor is
        broadcast from rank 0 of the group, in the order named."""
        body = await read_body(request, UpdateWeightsFromDistributedReq)
        names, dtypes, shapes = body.names, body.dtypes, body.shapes
        check_selector(body.selector)
        if body.load_format == "flattened_bucket":
            raise BadRequest("load_format: flattened_bucket (one packed tensor) is not supported by the embedded "
                             "engine: broadcast the tensors one by one as named (load_format null)")
        if not names:
            raise BadRequest("names, dtypes, shapes: required, non-empty lists of the same length")
        if not len(names) == len(dtypes) == len(shapes):
            raise BadRequest(f"names, dtypes, shapes: lengths differ ({len(names)}, {len(dtypes)}, {len(shapes)})")
        if twice := [n for n, k in Counter(names).items() if k > 1]:
            raise BadRequest(f"names: must be distinct ({twice[0]!r} twice)")
        group = self.groups.get(body.group_name)
        if group is None:
            raise BadRequest(f"group_name: no weight-update group {body.group_name!r} "
                             "(POST /init_weights_update_group first)")
        version = _text(body.weight_version)
        try:
            items = [(n, parse_dtype(d, f"dtypes[{i}]"), parse_shape(s, f"shapes[{i}]"))
                     for i, (n, d, s) in enumerate(zip(names, dtypes, shapes, strict=True))]
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        targets = check_targets(self.server._sched.runner.model, items)
        if not self.session_open:
            return _refused("update_weights_from_distributed requires an open weight-update session "
                            "(POST /begin_weight_update first, /end_weight_update after)", 400)
        device = self.server._sched.runner.device

        def receive() -> dict[str, torch.Tensor]:
            import torch.distributed as dist

            out = {}
            for name, dtype, shape in items:
                out[name] = torch.empty(shape, dtype=dtype, device=device)
                dist.broadcast(out[name], src=0, group=group)
            return out

        try:
            sources = await asyncio.to_thread(receive)
        except Exception as exc:  # noqa: BLE001 - the group is broken: say so; the old weights keep serving
            log.warning("update_weights_from_distributed failed: %s", exc)
            return web.json_response({"success": False, "message": f"Failed to receive weights: {exc}"},
                                     status=400)
        paused = await self._apply(installer(targets, sources), version, body.abort_all_requests)
        log.info("weights updated from group (%d tensors, weight_version=%s)", len(items),
                 self.server._sched.weight_version)
        return web.json_response({"success": True, "message": "Succeeded to update parameter online.",
                                  "num_paused_requests": paused})

    async def destroy_group(self, request: web.Request) -> web.Response:
        name = (await read_body(request, DestroyWeightsUpdateGroupReq, required=False)).group_name
        group = self.groups.pop(name, None)
        if group is None:
            raise BadRequest(f"group_name: no weight-update group {name!r}")
        await asyncio.to_thread(destroy_weight_group, group)
        return web.json_response({"success": True, "message": "Succeeded to destroy custom process group."})

    # ---- shared ---------------------------------------------------------------------------
    async def _apply(self, install: Install, version: str | None, abort_all: bool) -> int:
        sch = self.server._sched
        self.lora.forget()  # whole-model tensors: the served weights are the new base
        async with self.server._update_lock:
            if abort_all:
                await asyncio.wrap_future(sch.call(lambda: sch.abort(lambda s: True, "Aborted: weight update.")))
            paused = len(sch.running) if sch.paused else 0
            await asyncio.wrap_future(sch.call(lambda: sch.load_weights(install, version)))
        return paused


def check_selector(selector: Selector) -> None:
    """The embedded engine serves one model: no draft model (speculative decoding) to update."""
    if selector == "draft":
        raise BadRequest("selector: 'draft' names a draft model, and this engine has none ('all' or 'target')")


def _refused(message: str, status: int) -> web.Response:
    """SGLang's failure reply ({"success": false, "message"}), with the error envelope of every other 4xx."""
    return web.json_response({"success": False, "message": message, "error": {"message": message}},
                             status=status)


def _text(version: str | int | None) -> str | None:
    """A weight_version as generations report it (a number is taken as its text)."""
    return None if version is None else str(version)

