"""LoRA adapters on the embedded engine, through SGLang's API: ``/load_lora_adapter {"lora_name", "lora_path"}``
(a peft adapter directory), ``/unload_lora_adapter {"lora_name"}``, ``/update_weight_version {"new_version"}``.

The engine merges the adapter it loaded last into its weights (W = W0 + alpha/r * B @ A) and keeps W0 of every
module it touched, so each new adapter is merged onto the base, never onto the previous merge (no drift), and
unloading the served adapter restores the base. Generation then runs at the base model's speed (no adapter
matmuls per token); what it costs is one copy of the targeted weights and a merge per update (bench/bench_lora.py).
Every request gets the adapter merged last (a /generate ``lora_path`` must stay empty here), which is what an RL
trainer that loads one adapter version after another asks for.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import torch
from aiohttp import web

from slimecli.engine.bodies import LoadLoRAAdapterReq, UnloadLoRAAdapterReq, UpdateWeightVersionReq, read_body
from slimecli.engine.core import EngineCore, Install, roots
from slimecli.engine.protocol import BadRequest
from slimecli.model.lora import check_config, deltas, merged, read_adapter
from slimecli.net.paths import request_dir

log = logging.getLogger("slimecli.engine")
MAX_NAME = 256  # characters of an adapter name


class AdapterRoutes:
    def __init__(self, server: EngineCore) -> None:
        self.server = server
        self.base: dict[str, torch.Tensor] = {}  # the base weight of each module an adapter is merged into
        self.loaded: dict[str, str] = {}  # adapter name -> path (SGLang's loaded_adapters)
        self.merged: str | None = None  # the adapter the served weights hold

    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_post("/load_lora_adapter", self.load)
        router.add_post("/unload_lora_adapter", self.unload)
        router.add_post("/update_weight_version", self.update_weight_version)

    def forget(self) -> None:
        """The served weights were replaced whole (a full update): they are the new base, no adapter is merged."""
        self.base.clear()
        self.loaded.clear()
        self.merged = None

    async def merge(self, config: dict[str, Any], tensors: dict[str, torch.Tensor], name: str,
                    version: str | None = None) -> None:
        """Serve base + this adapter from the next scheduler step on; ValueError when it does not fit the model."""
        sch = self.server._sched
        model = sch.runner.model
        targets = model.state_dict(keep_vars=True)
        parts = deltas(config, tensors, targets)
        device = sch.runner.device
        untie = [m for m in parts if _shared(targets, m)]  # a tied output layer: merged, it must not move the inputs

        def compute() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:  # off the scheduler thread: it reads only
            out = {}
            with torch.no_grad():
                for module, (a, b, scale) in parts.items():
                    base = self.base.get(module)
                    if base is None:
                        base = targets[module].detach().clone()
                    out[module] = (base, merged(base, a.to(device), b.to(device), scale))
            return out

        new = await asyncio.to_thread(compute)

        def install(served: Any) -> None:
            for module in untie:
                owner = served.get_submodule(module.rsplit(".", 1)[0])
                owner.weight = torch.nn.Parameter(targets[module].detach().clone(), requires_grad=False)
                targets[module] = owner.weight
            self._installer(targets, new)(served)

        async with self.server._update_lock:
            await asyncio.wrap_future(sch.call(lambda: sch.load_weights(install, version)))
        self.merged = name

    def _installer(self, targets: dict[str, torch.Tensor], new: dict[str, tuple[torch.Tensor, torch.Tensor]]
                   ) -> Install:
        def install(_model: Any) -> None:
            with torch.no_grad():
                for module in [m for m in self.base if m not in new]:  # merged before, not by this adapter
                    targets[module].copy_(self.base.pop(module))
                for module, (base, weight) in new.items():
                    self.base.setdefault(module, base)
                    targets[module].copy_(weight)
        return install

    async def load(self, request: web.Request) -> web.Response:
        body = await read_body(request, LoadLoRAAdapterReq)
        name = body.lora_name
        if len(name) > MAX_NAME:
            raise BadRequest(f"lora_name: longer than {MAX_NAME} characters ({len(name)})")
        if name in self.loaded:
            return _failed(f"an adapter named {name!r} is already loaded (unload it first)")
        path = str(request_dir(body.lora_path, "lora_path", roots(self.server, request), "rollout.weight_roots"))
        try:
            config, tensors = await asyncio.to_thread(read_adapter, path)
            await self.merge(config, tensors, name)
        except (OSError, ValueError) as exc:
            log.warning("load_lora_adapter %s from %s failed: %s", name, path, exc)
            return _failed(f"Failed to load LoRA adapter {name} from {path}: {exc}")
        self.loaded[name] = path
        log.info("LoRA adapter %s merged from %s", name, path)
        return web.json_response({"success": True, "error_message": None, "loaded_adapters": self.loaded})

    async def unload(self, request: web.Request) -> web.Response:
        name = (await read_body(request, UnloadLoRAAdapterReq)).lora_name
        if name not in self.loaded:
            return _failed(f"no LoRA adapter named {name!r} is loaded (loaded: {', '.join(self.loaded) or 'none'})")
        if name == self.merged:  # the served adapter: back to the base weights
            sch = self.server._sched
            targets = sch.runner.model.state_dict(keep_vars=True)
            async with self.server._update_lock:
                await asyncio.wrap_future(sch.call(lambda: sch.load_weights(self._installer(targets, {}), None)))
            self.merged = None
        del self.loaded[name]
        return web.json_response({"success": True, "error_message": None, "loaded_adapters": self.loaded})

    async def update_weight_version(self, request: web.Request) -> web.Response:
        """SGLang's ``{"new_version", "abort_all_requests"?}``: the weight_version later generations report."""
        body = await read_body(request, UpdateWeightVersionReq)
        version = str(body.new_version)
        sch = self.server._sched
        async with self.server._update_lock:
            if body.abort_all_requests:
                await asyncio.wrap_future(sch.call(lambda: sch.abort(lambda s: True, "Aborted: weight update.")))
            await asyncio.wrap_future(sch.call(lambda: sch.load_weights(lambda _m: None, version)))
        return web.json_response({"success": True, "message": "Success"})


def _shared(targets: dict[str, torch.Tensor], name: str) -> bool:
    """Whether another served tensor shares this one's storage (tied embeddings)."""
    ptr = targets[name].untyped_storage().data_ptr()
    return any(k != name and t.untyped_storage().data_ptr() == ptr for k, t in targets.items())


def wire_config(raw: object) -> dict[str, Any]:
    """A shared-memory push's ``lora_config`` (adapter_config.json's fields); BadRequest naming what is wrong."""
    try:
        return check_config(raw)
    except ValueError as exc:
        raise BadRequest(f"lora_config: {exc}") from None


def _failed(message: str) -> web.Response:
    """SGLang's LoRA failure reply (400, success=false), with the error envelope of every other 4xx."""
    return web.json_response({"success": False, "error_message": message, "message": message,
                              "error": {"message": message}}, status=400)
