"""The engine's HTTP face: SGLang's native API (/generate, health, model/server info, abort, pause, weights)."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiohttp import web

from slimecli.engine.bodies import AWAITING_WEIGHTS
from slimecli.engine.compat import stream_due
from slimecli.engine.control import ControlRoutes
from slimecli.engine.core import readiness
from slimecli.engine.disk_update import update_weights_from_disk
from slimecli.engine.grammar import Compiled, GrammarCache
from slimecli.engine.protocol import BadRequest, Constraint, GenerateRequest, Item, SamplingParams, parse_generate
from slimecli.engine.scheduler import Scheduler, Update
from slimecli.engine.seq import FinishReason, Seq, build_reply
from slimecli.engine.settings import EngineSettings
from slimecli.engine.weights import WeightRoutes
from slimecli.net import server as net
from slimecli.net.auth import bearer_auth

log = logging.getLogger("slimecli.engine")
MAX_BODY = net.ENGINE_MAX_BODY
HEALTH_TIMEOUT_S = 30.0
# The routes that answer before the model is served and after the scheduler stopped: what the engine is, its
# load, and the clean-up of a weight-update group. Every other route needs the model (core.readiness).
OPEN_WHILE_NOT_READY = frozenset({"/get_model_info", "/model_info", "/get_server_info", "/server_info",
                                  "/get_load", "/v1/loads", "/destroy_weights_update_group"})


def default_device(device: str = "auto") -> str:
    """rollout.device: auto -> the first GPU when there is one, else the CPU; cpu, cuda, cuda:N as given."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


# a test hook: with SLIMECLI_TEST_ENGINE_HANG=PATH, the first /generate after PATH appears removes it and blocks the
# scheduler thread for good (a hung engine: its HTTP face answers, no generation finishes). Read when used, not
# at import: a process forked from the run's template (launch/template.py) imported this module before its
# environment was set.
HANG_ENV = "SLIMECLI_TEST_ENGINE_HANG"


def hang_scheduler_for_tests(sched: Any, marker: str) -> None:
    try:
        os.unlink(marker)
    except FileNotFoundError:
        return  # another request took it
    log.warning("SLIMECLI_TEST_ENGINE_HANG: blocking the scheduler thread")
    sched.call(lambda: time.sleep(1e9))


def error(message: str, status: int = 400) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


def _error_body(err: net.HttpError) -> dict[str, Any]:
    return {"error": {"message": err.message}}


def _refusal(request: web.Request, exc: Exception) -> net.HttpError | None:
    return net.HttpError(400, str(exc)) if isinstance(exc, BadRequest) else None


# Client mistakes become 4xx JSON; nothing a client sends can produce a 500 page.
json_errors = net.json_errors(_error_body, logger=log, translate=_refusal)


async def read_json(request: web.Request, required: bool = True) -> Any:
    """The body as a JSON object, or 400/408/413 naming the problem (required=False: an empty body is {});
    a lone UTF-16 surrogate in any string is a 400 (the tokenizer could not encode it)."""
    return await net.read_json(request, required, strict_text=True)


MAX_SEQS = 4096  # sequences one /generate may ask for (batch entries x n)


class EngineServer:
    """Owns the model, tokenizer and scheduler; routes HTTP requests to them."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.model_path, self.tokenizer_path = settings.model_path, settings.tokenizer
        self.dtype, self.device = settings.dtype, default_device(settings.device)
        self.max_running = settings.max_running
        self.host, self.port = settings.host, settings.port
        self.scheduler: Scheduler | None = None
        self.tokenizer: Any = None
        self.ready = False
        self.started = time.time()
        self._update_lock = asyncio.Lock()
        # (config.json bytes, served config object) last found the same architecture: a trainer exports the same
        # config.json every step, and parsing it costs more than the rest of the check
        self.same_config: tuple[bytes, Any] | None = None
        self.active: dict[str, int] = {}  # client rid -> unfinished sequences (event-loop side only)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.weight_roots: list[str | Path] | None = list(settings.weight_roots) if settings.weight_roots is not None else None
        self.loopback_loads_anywhere = settings.loopback_loads_anywhere
        self.limits = net.BodyLimits(net.MIN_BODY, settings.read_timeout_s)  # raised to the context's size by load()
        self.max_text_chars = 0  # a longer text cannot fit the context (set by load())
        self._encoder = ThreadPoolExecutor(1, thread_name_prefix="engine-tokenize")
        self._encode_tok: Any = None

    @property
    def _sched(self) -> Scheduler:
        """The scheduler that load() started (a route reaches it only once the readiness middleware let it in)."""
        if self.scheduler is None:
            raise RuntimeError("the engine's scheduler is not started (load() has not run)")
        return self.scheduler

    # ---- start-up ----------------------------------------------------------------------------
    def load(self) -> None:
        """Load model + tokenizer and start the scheduler (blocking; run off the event loop)."""
        from slimecli.model.loading import load_serving_model, load_tokenizer

        model = load_serving_model(self.model_path, self.dtype, self.device)
        self.tokenizer = load_tokenizer(self.tokenizer_path)
        self.config = model.config.get_text_config()
        self.vocab_size = int(self.config.vocab_size)
        self.context_length = int(getattr(self.config, "max_position_embeddings", 0) or 1 << 20)
        self.eos_ids = self._eos_ids(model)
        pad = self.tokenizer.pad_token_id
        if pad is None or pad >= self.vocab_size:
            pad = next(iter(self.eos_ids), 0)
        # The scheduler thread decodes with its own tokenizer object: the Rust tokenizer behind an HF fast
        # tokenizer must not be borrowed by two threads at once.
        self.scheduler = Scheduler(model, load_tokenizer(self.tokenizer_path), max_running=self.max_running,
                                   pad_id=int(pad), seed=self.settings.seed, dispatch=self._dispatch_threadsafe,
                                   prefix_cache_bytes=self.settings.prefix_cache_mb << 20)
        self.scheduler.start()
        self.grammars = GrammarCache(lambda: load_tokenizer(self.tokenizer_path), self.vocab_size, self.eos_ids)
        # Texts are encoded off the event loop, by a tokenizer of their own (one thread, see above).
        self._encode_tok = load_tokenizer(self.tokenizer_path)
        longest = max((len(t) for t in self.tokenizer.get_vocab()), default=1)
        self.max_text_chars = self.context_length * max(1, longest)
        self.limits.max_bytes = net.body_limit(self.context_length * self.max_running)

    def _eos_ids(self, model: Any) -> frozenset[int]:
        ids: set[int] = set()
        for source in (getattr(model, "generation_config", None), self.config):
            eos = getattr(source, "eos_token_id", None) if source is not None else None
            if isinstance(eos, int):
                ids.add(eos)
            elif isinstance(eos, list):
                ids.update(int(e) for e in eos)
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return frozenset(i for i in ids if 0 <= i < self.vocab_size)

    async def warm_up(self) -> None:
        seq = self._seq(Item(index=0, rid="warmup", prompt_ids=[next(iter(self.eos_ids), 0)], text=None,
                             params=SamplingParams(max_new_tokens=1, temperature=0.0)))
        await self._run([seq])

    def app(self) -> web.Application:
        auth = bearer_auth(lambda: self.settings.api_key, what="rollout.api_key")
        app = web.Application(middlewares=[json_errors, auth, readiness(self, OPEN_WHILE_NOT_READY)],
                              client_max_size=MAX_BODY)
        app[net.BODY_LIMITS] = self.limits
        r = app.router
        r.add_post("/generate", self.generate)
        from slimecli.engine import loads

        r.add_get("/v1/loads", functools.partial(loads.handle, self))
        for path, fn in (("/health", self.health), ("/health_generate", self.health_generate),
                         ("/get_model_info", self.model_info), ("/model_info", self.model_info),
                         ("/get_server_info", self.server_info), ("/server_info", self.server_info),
                         ("/get_load", self.get_load)):
            r.add_get(path, fn)
        ControlRoutes(self).add_to(r)  # abort, pause, continue, flush: bodies.py decodes their bodies
        r.add_post("/update_weights_from_disk", functools.partial(update_weights_from_disk, self))
        self.weight_routes = WeightRoutes(self)  # shared memory, SGLang's weight-update group
        self.weight_routes.add_to(r)
        return app

    # ---- scheduler <-> event loop ------------------------------------------------------------
    def _dispatch_threadsafe(self, updates: list[Update]) -> None:
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._dispatch, updates)

    @staticmethod
    def _dispatch(updates: list[Update]) -> None:
        for s, n, fin in updates:
            if s.notify is not None:
                s.notify(s, n, fin)

    async def _encode(self, req: GenerateRequest) -> None:
        """Each distinct text of the request as token ids (in the tokenizer thread; the loop keeps serving)."""
        texts = list({item.text for item in req.items if item.prompt_ids is None and item.text is not None})
        for t in texts:
            if len(t) > self.max_text_chars:
                raise BadRequest(f"text: {len(t)} characters cannot fit the model's context length "
                                 f"({self.context_length} tokens)")
        loop = asyncio.get_running_loop()
        # like SGLang: text is encoded with the tokenizer's own special-token rule (e.g. Llama's BOS)
        ids = await asyncio.gather(*(loop.run_in_executor(self._encoder, self._encode_tok.encode, t) for t in texts))
        encoded = dict(zip(texts, ids, strict=True))
        for item in req.items:
            if item.prompt_ids is None and item.text is not None:
                item.prompt_ids = list(encoded[item.text])

    def _seq(self, item: Item, stream: bool = False, grammars: dict[Constraint, Compiled] | None = None) -> Seq:
        ids = item.prompt_ids if item.prompt_ids is not None else self.tokenizer.encode(item.text)
        if not ids:
            raise BadRequest("text: encodes to no tokens")
        c = item.params.constraint
        return Seq(item=item, prompt_ids=list(ids), eos_ids=self.eos_ids, stream=stream,
                   grammar=grammars[c].matcher() if grammars and c is not None else None)

    async def _compile(self, req: GenerateRequest) -> dict[Constraint, Compiled]:
        """Each distinct grammar of the request, compiled (or found in the cache) in worker threads."""
        wanted = list({c for item in req.items if (c := item.params.constraint) is not None})
        done = await asyncio.gather(*(asyncio.to_thread(self.grammars.compile, c) for c in wanted))
        return dict(zip(wanted, done, strict=True))

    def _check_lengths(self, seqs: list[Seq]) -> None:
        for s in seqs:
            n = len(s.prompt_ids)
            if s.item.return_logprob and s.item.logprob_start_len > n:  # SGLang's scheduler refuses it too
                raise BadRequest(f"logprob_start_len: {s.item.logprob_start_len} is more than the {n} input tokens")
            if n >= self.context_length:
                raise BadRequest(f"input: {n} tokens is longer than the model's context length "
                                 f"({self.context_length} tokens)")
            if n + s.params.max_new_tokens > self.context_length:  # clip like SGLang: generation stops at the window
                from dataclasses import replace

                room = self.context_length - n
                s.item.params = replace(s.params, max_new_tokens=room, min_new_tokens=min(s.params.min_new_tokens, room))

    async def _run(self, seqs: list[Seq], on_update: Callable[[Update], None] | None = None) -> None:
        """Submit and wait for all to finish; abort them if the client goes away."""
        assert self.scheduler is not None
        done = asyncio.Event()
        remaining = {s.uid for s in seqs}

        def notify(s: Seq, n: int, fin: FinishReason | None) -> None:
            if on_update is not None:
                on_update((s, n, fin))
            if fin is not None and s.uid in remaining:
                remaining.discard(s.uid)
                self.active[s.item.group] -= 1
                if not self.active[s.item.group]:
                    del self.active[s.item.group]
                if not remaining:
                    done.set()

        for s in seqs:
            s.notify = notify
            self.active[s.item.group] = self.active.get(s.item.group, 0) + 1
        self.scheduler.submit(seqs)
        try:
            await done.wait()
        except asyncio.CancelledError:
            uids = {s.uid for s in seqs}
            self._sched.call(lambda: self._sched.abort(lambda s: s.uid in uids, "client disconnected"))
            raise

    def _not_ready(self) -> web.Response | None:
        if not self.ready or self.scheduler is None:
            return error("the engine is starting", 503)
        if not self.scheduler.alive():
            return error("the scheduler has stopped", 503)
        return None

    # ---- /generate ---------------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        req: GenerateRequest = parse_generate(await read_json(request), self.vocab_size)
        if self._sched.awaiting_weights:  # restarted mid-run: the trainer re-sends its weights first
            return error(AWAITING_WEIGHTS, 503)
        marker = os.environ.get(HANG_ENV, "")
        if marker and os.path.exists(marker):
            hang_scheduler_for_tests(self._sched, marker)
        if len(req.items) > MAX_SEQS:
            raise BadRequest(f"input / n: {len(req.items)} sequences in one request, at most {MAX_SEQS}")
        await self._encode(req)
        grammars = await self._compile(req)
        seqs = [self._seq(item, req.stream, grammars) for item in req.items]
        self._check_lengths(seqs)
        dup = sorted({s.item.group for s in seqs} & self.active.keys())
        if dup:
            raise BadRequest(f"rid: {dup[0]!r} is already running")
        if req.stream:
            return await self._stream(request, req, seqs)
        await self._run(seqs)
        wv = self._sched.weight_version
        replies = [build_reply(s, self.tokenizer, wv) for s in seqs]
        return net.json_response(replies if req.batched else replies[0])

    async def _stream(self, request: web.Request, req: GenerateRequest, seqs: list[Seq]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        queue: asyncio.Queue[Update] = asyncio.Queue()
        task = asyncio.ensure_future(self._run(seqs, on_update=queue.put_nowait))
        try:
            pending, sent = len(seqs), {s.uid: 0 for s in seqs}
            while pending:
                s, n, fin = await queue.get()
                if fin is None and not stream_due(s.params.stream_interval, sent[s.uid], n):
                    continue
                sent[s.uid] = n
                chunk = build_reply(s, self.tokenizer, self._sched.weight_version, n, fin)
                if req.batched:
                    chunk["index"] = s.item.index
                await resp.write(f"data: {net.dumps(chunk)}\n\n".encode())
                pending -= fin is not None
            await task
            await resp.write(b"data: [DONE]\n\n")
        except (asyncio.CancelledError, ConnectionResetError):
            task.cancel()
            raise
        return resp

    # ---- small endpoints ---------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")  # not ready: the readiness middleware answered 503 instead

    async def health_generate(self, request: web.Request) -> web.Response:
        if self._sched.paused:
            return web.Response(text="")
        seq = self._seq(Item(index=0, rid=f"health-{time.monotonic_ns()}", prompt_ids=[next(iter(self.eos_ids), 0)],
                             text=None, params=SamplingParams(max_new_tokens=1, temperature=0.0)))
        try:
            await asyncio.wait_for(self._run([seq]), HEALTH_TIMEOUT_S)
        except TimeoutError:
            return error("a one-token generation did not finish in time", 503)
        if seq.finish and seq.finish["type"] == "abort":
            return error(f"generation failed: {seq.finish.get('message')}", 503)
        return web.Response(text="")

    def _model_info(self) -> dict[str, Any]:
        return {"model_path": self.model_path, "tokenizer_path": self.tokenizer_path, "is_generation": True,
                "weight_version": self.scheduler.weight_version if self.scheduler else "default",
                "preferred_sampling_params": None, "has_image_understanding": False,
                "has_audio_understanding": False, "model_type": getattr(getattr(self, "config", None),
                                                                       "model_type", None)}

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response(self._model_info())

    async def server_info(self, request: web.Request) -> web.Response:
        sch = self.scheduler
        info = {"engine": "slimecli-local", "model_path": self.model_path, "tokenizer_path": self.tokenizer_path,
                "host": self.host, "port": self.port, "dtype": self.dtype, "device": str(self.device),
                "max_running_requests": self.max_running, "context_length": getattr(self, "context_length", None),
                "vocab_size": getattr(self, "vocab_size", None),
                "weight_version": sch.weight_version if sch else "default", "ready": self.ready,
                "paused": bool(sch and sch.paused), "uptime_s": time.time() - self.started,
                "internal_states": [{**(sch.load() if sch else {}), **(sch.stats if sch else {})}]}
        return web.json_response(info)

    async def get_load(self, request: web.Request) -> web.Response:
        return web.json_response(self.scheduler.load() if self.scheduler else {})
