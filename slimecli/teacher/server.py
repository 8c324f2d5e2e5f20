"""The teacher server's HTTP front (rank 0): request queue, one dispatcher per DP group, weight updates.

Requests wait in one queue; each DP group's dispatcher takes the next one when its group is free, so
groups balance themselves. A client that disconnects while its request is queued cancels it. A weight
update turns new /generate requests away (503), waits for the queue and the running requests to drain,
then loads the checkpoint on every rank.

/healthz answers 503 while the ranks cannot serve: a DP group whose exchange raised (a dead or out-of-step
peer: the group is not used again), a call that has run past the bound no client waits beyond, or a background
task that stopped. It asks the ranks nothing, so a probe never queues behind a request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from slimecli.config.convert import to_plain
from slimecli.config.schema import SlimeConfig
from slimecli.net import server as net
from slimecli.net.auth import bearer_auth
from slimecli.net.paths import request_dir
from slimecli.teacher.protocol import MAX_LABEL_WIDTH, GenerateRequest, RequestError, parse_generate, parse_update
from slimecli.teacher.ranks import Exchange

log = logging.getLogger("slimecli.teacher")
SERVER_TYPE = "slimecli_teacher"
MAX_BODY = net.TEACHER_MAX_BODY


@dataclass
class Job:
    req: GenerateRequest
    future: asyncio.Future
    state: str = "queued"  # queued -> running -> done, or queued -> cancelled
    enqueued: float = field(default_factory=time.monotonic)
    started: float = 0.0


def weight_roots(cfg: SlimeConfig, model_path: str) -> list[str]:
    """teacher.weight_roots, else the first checkpoint's directory and the run directory."""
    if cfg.teacher.weight_roots:
        return list(cfg.teacher.weight_roots)
    run = os.environ.get("SLIMECLI_RUN_DIR") or cfg.run.dir
    return [str(Path(model_path).resolve().parent), *([run] if run else [])]


class Front:
    def __init__(self, cfg: SlimeConfig, exchanges: list[Exchange], vocab_size: int, model_path: str) -> None:
        self.cfg, self.t = cfg, cfg.teacher
        self.exchanges = exchanges
        self.executors = [ThreadPoolExecutor(1, thread_name_prefix=f"teacher-dp{d}") for d in range(len(exchanges))]
        self.last_call = [time.monotonic()] * len(exchanges)
        self.vocab_size, self.model_path, self.weight_version = vocab_size, model_path, 0
        self.weight_roots = weight_roots(cfg, model_path)
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        self.queued = self.running = self.finished = self.finished_tokens = self.pending_tokens = 0
        self.cancelled = self.failed = 0
        self.group_done = [0] * len(exchanges)  # requests each DP group has answered
        self.update: asyncio.Future | None = None
        self.update_path: str | None = None
        self._tasks: list[asyncio.Task] = []
        self.broken: list[str | None] = [None] * len(exchanges)  # why DP group d can no longer be used
        self.busy: list[tuple[float, float] | None] = [None] * len(exchanges)  # (started, bound) of d's call

    # ---- dispatch -------------------------------------------------------------------------------------
    async def call(self, d: int, msg: dict[str, Any]) -> dict[str, Any]:
        """One exchange on group d's thread. Its start is taken when the thread runs it (not when queued), so
        /healthz can tell a call stuck in a collective; an exchange that raises leaves the group broken."""
        bound = self.t.update_timeout_s if msg.get("op") == "load" else self.t.request_timeout_s

        def run() -> dict[str, Any]:
            self.busy[d] = (time.monotonic(), bound)
            try:
                return self.exchanges[d](msg)
            finally:
                self.busy[d] = None

        self.last_call[d] = time.monotonic()
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executors[d], run)
        except Exception as exc:  # the ranks of group d are out of step: never send it another message
            self.broken[d] = f"{type(exc).__name__}: {exc}"
            log.critical("teacher DP group %d broke on %s: %s", d, msg.get("op"), self.broken[d])
            raise
        finally:
            self.last_call[d] = time.monotonic()

    def problems(self) -> list[str]:
        """Why requests cannot be served now (empty: they can); from the front's own state only."""
        now = time.monotonic()
        out = [f"DP group {d} is broken ({why})" for d, why in enumerate(self.broken) if why]
        out += [f"DP group {d} has been in one call for {now - b[0]:.0f}s (bound {b[1]:g}s)"
                for d, b in enumerate(self.busy) if b and now - b[0] > b[1]]
        out += [f"the {task.get_name()} task stopped" for task in self._tasks if task.done()]
        return out

    def _refuse_queued(self) -> None:
        """With no DP group left, answer what waits in the queue instead of leaving it there for ever."""
        while not self.queue.empty():
            job = self.queue.get_nowait()
            if job.state != "queued":
                continue
            self.queued -= 1
            self.pending_tokens -= job.req.tokens
            job.state = "done"
            if not job.future.done():
                job.future.set_result({"ok": False, "status": 503, "error": "; ".join(self.problems())})

    async def dispatcher(self, d: int) -> None:
        while True:
            job = await self.queue.get()
            if job.state == "cancelled":
                continue
            if self.broken[d]:  # broken since (by a keep-alive or a load): the job is for the other groups
                self.queue.put_nowait(job)
                break
            self.queued -= 1
            self.pending_tokens -= job.req.tokens
            job.state, job.started = "running", time.monotonic()
            self.running += 1
            try:
                r = job.req
                reply = await self.call(d, {"op": "score", "input_ids": r.input_ids, "sample_n": r.sample_n,
                                            "labels": r.labels, "temperature": r.temperature,
                                            "delay_s": r.delay_s, "fault": r.fault})
            except Exception as exc:  # noqa: BLE001 - an exchange that broke (a dead peer): fail the request; the other
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}  # groups, if any, keep serving
            finally:
                self.running -= 1
            self.group_done[d] += 1
            job.state = "done"
            if not job.future.done():
                job.future.set_result(reply)
            if self.broken[d]:
                break
        if all(self.broken):
            self._refuse_queued()

    async def keepalive(self) -> None:
        pinging: dict[int, asyncio.Task] = {}
        while True:
            await asyncio.sleep(self.t.keepalive_s / 3)
            for d in range(len(self.exchanges)):
                if self.broken[d] or (d in pinging and not pinging[d].done()):
                    continue
                if time.monotonic() - self.last_call[d] > self.t.keepalive_s:
                    pinging[d] = asyncio.create_task(self.call(d, {"op": "noop"}))

    async def load_reporter(self) -> None:
        last_n, last_tok, last_t = 0, 0, time.monotonic()
        while True:
            await asyncio.sleep(self.t.log_interval_s)
            now = time.monotonic()
            dn, dtok, dt = self.finished - last_n, self.finished_tokens - last_tok, max(now - last_t, 1e-9)
            if dn or self.queued or self.running:
                log.info("load: queue=%d running=%d req/s=%.2f tok/s=%.1f", self.queued, self.running, dn / dt,
                         dtok / dt)
            last_n, last_tok, last_t = self.finished, self.finished_tokens, now

    def reset_counters(self) -> None:
        """After the private warm-up: /get_loads counts public requests only."""
        self.finished = self.finished_tokens = self.cancelled = self.failed = 0
        self.group_done = [0] * len(self.exchanges)

    def start_background(self) -> None:
        self._tasks = [asyncio.create_task(self.dispatcher(d), name=f"dispatcher-{d}")
                       for d in range(len(self.exchanges))]
        self._tasks += [asyncio.create_task(self.keepalive(), name="keepalive"),
                        asyncio.create_task(self.load_reporter(), name="load-reporter")]

    # ---- handlers -------------------------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.Response:
        if self.update is not None:
            raise RequestError(503, f"a weight update to {self.update_path} is running; retry later")
        if all(self.broken):
            raise RequestError(503, "the teacher's ranks cannot serve: " + "; ".join(self.problems()))
        req = parse_generate(await _json(request), self.vocab_size, self.t.max_length, self.t.temperature)
        job = Job(req, asyncio.get_running_loop().create_future())
        self.queued += 1
        self.pending_tokens += req.tokens
        self.queue.put_nowait(job)
        try:
            reply = await job.future
        except asyncio.CancelledError:  # the client went away
            if job.state == "queued":
                job.state = "cancelled"
                self.queued -= 1
                self.pending_tokens -= req.tokens
                self.cancelled += 1
                log.info("generate cancelled while queued: client disconnected (tokens=%d)", req.tokens)
            raise
        if not reply["ok"]:  # the ranks' own refusals carry a 4xx status (agreed by every rank of the group)
            self.failed += 1
            status = int(reply.get("status", 500))
            (log.info if status < 500 else log.error)("generate failed (%d): %s", status, reply["error"])
            return web.json_response({"error": reply["error"]}, status=status)
        self.finished += 1
        self.finished_tokens += req.tokens
        rid = uuid.uuid4().hex
        log.info("generate id=%s tokens=%d sample_n=%d labels=%d wait_ms=%.1f run_ms=%.1f", rid, req.tokens,
                 req.sample_n, len(req.labels[0]) if req.labels else 0, (job.started - job.enqueued) * 1e3,
                 (time.monotonic() - job.started) * 1e3)
        return net.json_response({"request_id": rid, **reply["result"]})  # non-finite -> null, never NaN

    async def update_weights(self, request: web.Request) -> web.Response:
        path, timeout, delay = parse_update(await _json(request), self.t.update_timeout_s)
        path = str(request_dir(path, "model_path", self.weight_roots, "teacher.weight_roots"))  # 400 for what is no path, 403 outside
        if self.update is not None:
            if path != self.update_path:
                raise RequestError(409, f"an update to {self.update_path} is already running")
            status, body = await asyncio.shield(self.update)
            return web.json_response({**body, "coalesced": True}, status=status)
        if any(self.broken):  # a broken group would never answer the load
            raise RequestError(503, "the teacher's ranks cannot load: " + "; ".join(self.problems()))
        if path == self.model_path:
            return web.json_response({"success": True, "skipped": True, "coalesced": False, "model_path": path,
                                      "message": "this checkpoint is already loaded"})
        if not (Path(path) / "config.json").is_file():
            raise RequestError(400, f"model_path {path} is not a checkpoint directory (no config.json)")
        self.update, self.update_path = asyncio.get_running_loop().create_future(), path
        asyncio.create_task(self._run_update(path, timeout, delay, self.update))  # survives a client that goes away
        status, body = await asyncio.shield(self.update)
        return web.json_response({**body, "coalesced": False}, status=status)

    async def _run_update(self, path: str, timeout: float, delay: float, done: asyncio.Future) -> None:
        t0 = time.monotonic()
        try:
            while self.queued or self.running:
                if time.monotonic() - t0 > timeout:
                    result = (503, {"success": False, "error": f"requests still running after {timeout:g}s; "
                                                              "weights not updated"})
                    break
                await asyncio.sleep(0.02)
            else:
                replies = await asyncio.gather(*(self.call(d, {"op": "load", "path": path, "delay_s": delay})
                                                 for d in range(len(self.exchanges))))
                errors = [r["error"] for r in replies if not r["ok"]]
                if errors:
                    result = (500, {"success": False, "error": "; ".join(sorted(set(errors)))})
                else:
                    self.model_path, self.vocab_size = path, int(replies[0]["vocab_size"])
                    self.weight_version += 1
                    result = (200, {"success": True, "skipped": False, "model_path": path,
                                    "message": f"loaded in {time.monotonic() - t0:.1f}s"})
        except Exception as exc:  # noqa: BLE001 - the reply and the log line below name it; old weights serve on
            result = (500, {"success": False, "error": f"{type(exc).__name__}: {exc}"})
        log.info("update_weights_from_disk %s -> %d %s", path, result[0], result[1].get("error", ""))
        self.update, self.update_path = None, None
        done.set_result(result)

    async def healthz(self, request: web.Request) -> web.Response:
        problems = self.problems()
        if problems:
            return web.json_response({"ok": False, "error": "; ".join(problems), "problems": problems}, status=503)
        return web.json_response({"ok": True})

    async def detect(self, request: web.Request) -> web.Response:
        return web.json_response({"server_type": SERVER_TYPE})

    async def info(self, request: web.Request) -> web.Response:
        config = to_plain(self.cfg)
        for part in (config.get("teacher", {}), config.get("rollout", {}), *config.get("teachers", [])):
            if part.get("api_key"):  # the secrets of the config: never in a reply
                part["api_key"] = "***"
        return web.json_response({"server_type": SERVER_TYPE, "model_path": self.model_path,
                                  "vocab_size": self.vocab_size, "tp": self.t.tp, "dp": self.t.dp,
                                  "temperature": self.t.temperature, "max_length": self.t.max_length,
                                  "weight_version": self.weight_version, "config": config})

    async def get_loads(self, request: web.Request) -> web.Response:
        return web.json_response({"queue_size": self.queued, "in_flight": self.running,
                                  "finished_requests": self.finished, "finished_tokens": self.finished_tokens,
                                  "pending_tokens": self.pending_tokens, "cancelled_requests": self.cancelled,
                                  "failed_requests": self.failed, "updating": self.update is not None,
                                  "dp": len(self.exchanges), "per_dp_group_requests": self.group_done})

    def app(self) -> web.Application:
        auth = bearer_auth(self.t.api_key, open_path=lambda path: path == "/healthz", what="teacher.api_key")
        app = web.Application(middlewares=[net.json_errors(_error_body, logger=log, translate=_refusal), auth],
                              client_max_size=MAX_BODY)
        app[net.BODY_LIMITS] = net.BodyLimits(body_limit(self.t.max_length or context_length(self.model_path)))
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/update_weights_from_disk", self.update_weights)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/detect", self.detect)
        app.router.add_get("/info", self.info)
        app.router.add_get("/get_loads", self.get_loads)
        return app


def _error_body(err: net.HttpError) -> dict[str, Any]:
    return {"error": err.message, **err.extra}


def _refusal(request: web.Request, exc: Exception) -> net.HttpError | None:
    """The teacher's own refusals (RequestError: status and body); None for anything else (a bug)."""
    if not isinstance(exc, RequestError):
        return None
    if request.path == "/generate":
        log.info("generate rejected %d: %s", exc.status, exc.body["error"])
    extra = {k: v for k, v in exc.body.items() if k != "error"}
    return net.HttpError(exc.status, str(exc.body["error"]), extra=extra)


async def _json(request: web.Request) -> Any:
    return await net.read_json(request, json_only=True, strict_text=True)


def body_limit(tokens: int) -> int:
    """A body with `tokens` input ids and a label_token_ids row of the widest allowed at each of them."""
    return net.body_limit(tokens, per_token=8 * (1 + MAX_LABEL_WIDTH), cap=MAX_BODY)


def context_length(model_path: str, default: int = 1 << 17) -> int:
    """The model's max_position_embeddings (its text config's), from config.json; `default` if it has none."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return default
    for c in (cfg, cfg.get("text_config") or {}):
        n = c.get("max_position_embeddings") if isinstance(c, dict) else None
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n
    return default
