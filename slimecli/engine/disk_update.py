"""POST /update_weights_from_disk: load a checkpoint directory, only from under the engine's weight roots.

The path is checked first (slimecli.net.paths: ~ expanded, symlinks and .. resolved; 400 for what is not a
path, 403 outside the roots), then loaded off the event loop and checked against the served model
(vocabulary, architecture); a failed load answers success=false and the old weights keep serving.

The roots: rollout.weight_roots where set, for every client. Unset, a client on this host (loopback) may load
any directory, as it may from SGLang (slime's and other SGLang clients name whatever their trainer wrote),
and a client elsewhere only the run directory or the served model's own.

An update that is refused leaves generation running: SGLang clients pause first and raise on a 4xx before they
send continue_generation (slime does), so a refusal that kept the pause would hang every later request.

A checkpoint of the served architecture whose tensors have the served names and shapes (the trainer's own
export, every step) is read and copied into the served model in place, between two scheduler steps, as SGLang
does; building a new model each step cost 35 ms of a 300 ms quickstart step. Anything else is loaded whole.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from slimecli.engine.bodies import UpdateWeightFromDiskReq, read_body
from slimecli.engine.core import EngineCore, Install, installer, roots
from slimecli.engine.protocol import BadRequest
from slimecli.net import server as net
from slimecli.net.paths import request_dir

if TYPE_CHECKING:
    import torch

log = logging.getLogger("slimecli.engine")


async def update_weights_from_disk(self: EngineCore, request: web.Request) -> web.Response:
    """SGLang's reply: {"success", "message", "num_paused_requests"}; refused (4xx), generation continues."""
    try:
        resp = await _update(self, request)
    except net.HttpError as exc:
        if await _continue_if_paused(self):
            exc.message += CONTINUED
        raise
    except BadRequest as exc:
        if await _continue_if_paused(self):
            raise BadRequest(f"{exc}{CONTINUED}") from None
        raise
    if resp.status >= 400 and await _continue_if_paused(self):
        body = json.loads(resp.text or "{}")
        body["message"] = str(body.get("message", "")) + CONTINUED
        return web.json_response(body, status=resp.status)
    return resp


CONTINUED = " (generation continues: the pause before this update was lifted)"


async def _continue_if_paused(self: EngineCore) -> bool:
    sch = self._sched
    if not sch.paused:
        return False
    await asyncio.wrap_future(sch.call(sch.resume))
    log.warning("update_weights_from_disk refused: generation continues with the old weights")
    return True


async def _update(self: EngineCore, request: web.Request) -> web.Response:
    body = await read_body(request, UpdateWeightFromDiskReq)
    path = str(request_dir(body.model_path, "model_path", roots(self, request), "rollout.weight_roots"))
    sch = self._sched
    async with self._update_lock:
        try:
            install = await asyncio.to_thread(_in_place, self, path)
            model = None if install is not None else await asyncio.to_thread(_load_compatible, self, path)
        except Exception as exc:  # noqa: BLE001 - reported to the caller; the old weights keep serving
            log.warning("update_weights_from_disk(%s) failed: %s", path, exc)
            return web.json_response({"success": False, "message": f"Failed to load {path}: {exc}",
                                      "num_paused_requests": 0}, status=400)
        if body.abort_all_requests:
            await asyncio.wrap_future(sch.call(lambda: sch.abort(lambda s: True, "Aborted: weight update.")))
        paused = len(sch.running) if sch.paused else 0
        new_version = None if body.weight_version is None else str(body.weight_version)
        self.weight_routes.lora.forget()  # whole-model weights: the new base, no adapter merged
        if install is not None:
            await asyncio.wrap_future(sch.call(lambda: sch.load_weights(install, new_version)))
        else:
            await asyncio.wrap_future(sch.call(lambda: sch.swap_model(model, new_version)))
        self.model_path = path
    log.info("weights updated from %s (weight_version=%s)", path, sch.weight_version)
    return web.json_response({"success": True, "message": "Succeeded to update model weights.",
                              "num_paused_requests": paused})


def _load_compatible(self: EngineCore, path: str) -> Any:
    from slimecli.model.loading import load_serving_model

    if not (Path(path) / "config.json").is_file():
        raise FileNotFoundError(f"no config.json in {path}")
    model = load_serving_model(path, self.dtype, self.device)
    cfg = model.config.get_text_config()
    if int(cfg.vocab_size) != self.vocab_size:
        raise ValueError(f"vocab_size {cfg.vocab_size} differs from the served model's {self.vocab_size}")
    if getattr(cfg, "model_type", None) != getattr(self.config, "model_type", None):
        raise ValueError(f"model_type {cfg.model_type} differs from the served {self.config.model_type}")
    return model


# config keys that name where or how a checkpoint was written, not what it computes
_PROVENANCE = {"_name_or_path", "transformers_version", "torch_dtype", "dtype"}


def _in_place(self: EngineCore, path: str) -> Install | None:
    """What copies this checkpoint's tensors into the served model, when its config is the served one's and
    its tensors are exactly the served tensors (tied ones stored once); None when it must be loaded whole."""
    from safetensors import safe_open
    from transformers import AutoConfig

    from slimecli.model.loading import remote_code_trusted

    files = sorted(Path(path).glob("*.safetensors"))
    if not files or not (Path(path) / "config.json").is_file():
        return None
    if self.weight_routes.segment is not None:
        return None  # the served tensors are views of a shared segment the trainer writes: not ours to overwrite
    model = self._sched.runner.model
    raw = (Path(path) / "config.json").read_bytes()
    if self.same_config is None or self.same_config[0] != raw or self.same_config[1] is not model.config:
        config = AutoConfig.from_pretrained(path, trust_remote_code=remote_code_trusted()).to_dict()
        served = model.config.to_dict()
        if {k: v for k, v in config.items() if k not in _PROVENANCE} != {
                k: v for k, v in served.items() if k not in _PROVENANCE}:
            return None
        self.same_config = (raw, model.config)
    targets = model.state_dict(keep_vars=True)
    sources: dict[str, torch.Tensor] = {}
    device = self._sched.runner.device
    for file in files:
        with safe_open(str(file), framework="pt", device=str(device)) as f:
            for name in f.keys():  # safe_open is not a mapping
                target = targets.get(name)
                if target is None or name in sources:
                    return None
                tensor = f.get_tensor(name)
                if tensor.shape != target.shape or tensor.is_floating_point() != target.is_floating_point():
                    return None
                sources[name] = tensor
    written = {targets[name].data_ptr() for name in sources}
    if any(t.data_ptr() not in written for t in targets.values()):
        return None  # a served tensor the checkpoint leaves out (and does not share storage with one it has)
    return installer({name: targets[name] for name in sources}, sources)
