"""What the Anthropic and OpenAI adapters share: sessions, limits, one engine turn, errors, disconnects.

A subclass translates its API's request into chat messages + tools and the turn back into its reply format.
Every refusal is a 4xx JSON body in the client's own error format; a turn is recorded only after its reply
was written; a client that goes away cancels the handler, which aborts the engine request.

agent.constrain (see slimecli.model.tool_grammar) adds a grammar to each turn's sampling params:
- tool_calls: plain text or tool calls valid against the request's tools, honouring its tool_choice;
- choices: exactly one of the session's alternatives (`set_choices`, else agent.choices_file), while the
  conversation has no tool result yet. Once a tool ran (the choice was made and executed), the next turn
  follows agent.choices_then: `final` (default) constrains it to the fixed text agent.choices_final, so the
  CLI ends its run after executing exactly one listed edit; `none` leaves it unconstrained; `tool_calls`
  constrains it as in tool_calls mode.

A streaming request (`stream: true`) is streamed from the engine as it is sampled (slimecli.agent.api.streaming
has the rule for what is shown when). Everything a stream echoes is checked before it opens, and it opens only
when the engine's first chunk arrives, so a refusal is still an HTTP error; a failure after that (the engine
aborted the turn for a weight update, or failed) is the API's in-stream error event, never a cut connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from slimecli.agent.api.engine_link import EngineLink, Generation, Progress
from slimecli.agent.api.fields import ApiError, echoed, int_field, text_of
from slimecli.agent.api.render import Renderer
from slimecli.agent.api.streaming import KEEPALIVE_S, STREAM_INTERVAL, LiveText, StreamWriter, open_sse
from slimecli.agent.trajectory.manager import SessionClosed, TooManyTurns, TrajectoryManager, Turn
from slimecli.config.groups.agent import AgentConfig
from slimecli.config.groups.rollout import RolloutConfig
from slimecli.model import tool_grammar as constrain
from slimecli.model.tool_calls import ParsedOutput, ToolParser
from slimecli.model.tool_grammar import GrammarError, ToolChoice
from slimecli.net import server as net
from slimecli.rollout.client import EngineError, EngineRejected

log = logging.getLogger(__name__)
__all__ = ["Adapter", "AdapterSettings", "ApiError", "TurnRequest", "TurnResult", "echoed", "int_field", "new_id",
           "send_json", "text_of"]


@dataclass
class TurnRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    max_tokens: int | None
    stop: list[str] = field(default_factory=list)
    tool_choice: ToolChoice = ToolChoice()


@dataclass
class TurnResult:
    prompt_ids: list[int]
    gen: Generation
    parsed: ParsedOutput
    stop_sequence: str | None = None
    capped: bool = False  # cut by the adapter's own per-turn cap (agent.max_new_tokens), not by the client
    context_limited: bool = False  # the context window left less room than the turn asked for
    engine_s: float = 0.0  # time in the engine's /generate
    constrained: bool = False  # sampled under a grammar (agent.constrain)

    @property
    def truncated(self) -> bool:
        """Length-finished as far as the client is concerned (its max_tokens or the context window)."""
        return self.gen.finish_reason == "length" and not self.capped

    def to_turn(self) -> Turn:
        return Turn(self.prompt_ids, self.gen.output_ids, self.gen.log_probs, self.gen.finish_reason,
                    self.parsed.ill_formed, self.gen.weight_version,
                    tuple(call.name for call in self.parsed.tool_calls), self.context_limited, self.engine_s,
                    self.constrained, self.gen.token_versions)


@dataclass(frozen=True)
class AdapterSettings:
    """What an adapter reads: the agent's config itself (agent.max_new_tokens caps each turn, agent.constrain and
    agent.choices_* constrain it), the run's sampling (rollout.temperature, top_p, top_k), and what only the
    server knows."""

    agent: AgentConfig = field(default_factory=AgentConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    model_name: str = "slimecli"
    max_body_bytes: int = net.ADAPTER_MAX_BODY
    stream_interval: int = STREAM_INTERVAL  # streamed turns: engine chunks every this many tokens


class Adapter:
    """Base class; subclasses add their routes in `routes()` and their error format in `error_body()`."""

    name = "base"

    def __init__(self, renderer: Renderer, engine: EngineLink, manager: TrajectoryManager, parser: ToolParser,
                 settings: AdapterSettings | None = None) -> None:
        self.renderer = renderer
        self.engine = engine
        self.manager = manager
        self.parser = parser
        self.settings = settings or AdapterSettings()
        self._engine_ready = False
        self.call_format = getattr(parser, "call_format", None)
        self._choices: dict[str, tuple[str, ...]] = {}
        self._default_choices: tuple[str, ...] | None = None
        self._check_constrain()

    def _check_constrain(self) -> None:
        """Fail at start-up, not on the first turn, when the constraint settings cannot work."""
        s = self.settings.agent  # agent.constrain and agent.choices_then are Literals: the config decoder checked them
        calls = s.constrain == "tool_calls" or (s.constrain == "choices" and s.choices_then == "tool_calls")
        if calls and self.call_format is None:
            raise ValueError("constrained tool calls need a tool parser with a `call_format` (ToolCallFormat); "
                             f"{type(self.parser).__name__} has none")
        if s.constrain == "choices":
            if not s.choices_final and s.choices_then == "final":
                raise ValueError("agent.choices_final must be a non-empty text when agent.choices_then=final")
            if s.choices_file:
                self._default_choices = constrain.load_choices(s.choices_file, self.call_format)

    # --- choices (agent.constrain=choices) ------------------------------------------------------------
    def set_choices(self, session_id: str, choices: list[Any]) -> None:
        """Register the alternatives of one session before its CLI starts (the runner's hook).

        Each is an output text, or {"name": ..., "arguments": {...}} for a tool call in the parser's format.
        Choices of sessions the trajectory manager has closed are forgotten here. ValueError when malformed.
        """
        texts = constrain.resolve_choices(choices, self.call_format)
        for sid in [sid for sid in self._choices if self.manager.is_closed(sid)]:
            del self._choices[sid]
        self._choices[session_id] = texts

    def clear_choices(self, session_id: str) -> None:
        self._choices.pop(session_id, None)

    def constraint(self, sid: str, req: TurnRequest) -> dict[str, str]:
        """The sampling params that constrain this turn ({} when unconstrained); ApiError 400 when impossible."""
        s = self.settings.agent
        mode = s.constrain
        if mode == "none":
            return {}
        tokens = self.renderer.added_tokens
        try:
            if mode == "choices":
                if constrain.has_tool_result(req.messages):
                    if s.choices_then == "final":
                        return {"ebnf": constrain.choices_grammar([s.choices_final], tokens)}
                    if s.choices_then == "none":
                        return {}
                else:
                    texts = self._choices.get(sid) or self._default_choices
                    if not texts:
                        raise ApiError(400, f"agent.constrain=choices: session {sid[:64]!r} has no choices "
                                       "(register them with set_choices, or set agent.choices_file)", retry=False)
                    return {"ebnf": constrain.choices_grammar(texts, tokens)}
            if self.call_format is None:  # refused at start-up; kept for a subclass that swaps the parser
                raise GrammarError(f"the tool parser {type(self.parser).__name__} declares no call_format")
            return {"ebnf": constrain.tool_call_grammar(req.tools, req.tool_choice, self.call_format, tokens,
                                                        s.constrain_max_string_len)}
        except GrammarError as exc:
            raise ApiError(400, f"agent.constrain={mode}: {exc}", retry=False) from None

    # --- to override --------------------------------------------------------------------------------
    def routes(self) -> list[web.RouteDef]:
        raise NotImplementedError

    def error_body(self, status: int, message: str, kind: str | None) -> dict[str, Any]:
        raise NotImplementedError

    # --- server -------------------------------------------------------------------------------------
    def app(self) -> web.Application:
        errors = net.json_errors(self._format_error, logger=log, translate=self._refusal)
        app = web.Application(client_max_size=self.settings.max_body_bytes, middlewares=[errors])
        app.add_routes([web.get("/healthz", self._healthz), *self.routes()])
        return app

    def _format_error(self, err: net.HttpError) -> dict[str, Any]:
        return self.error_body(err.status, err.message, err.kind)

    @staticmethod
    def _refusal(request: web.Request, exc: Exception) -> net.HttpError | None:
        """ApiError as it says; an engine that fails is 503 (the CLI retries); None: a bug of ours (500)."""
        if isinstance(exc, ApiError):
            return net.HttpError(exc.status, exc.message, kind=exc.kind, headers=exc.headers)
        if isinstance(exc, EngineError):
            log.warning("engine error: %s", exc)
            return net.HttpError(503, f"rollout engine unavailable: {exc}")
        return None

    async def _healthz(self, request: web.Request) -> web.Response:
        if not self._engine_ready:
            self._engine_ready = await self.engine.healthy()
        if not self._engine_ready:
            return web.json_response({"ok": False, "reason": "engine not ready"}, status=503)
        return web.json_response({"ok": True, "adapter": self.name})

    # --- helpers for subclasses ---------------------------------------------------------------------
    @staticmethod
    async def read_json(request: web.Request) -> dict[str, Any]:
        """The body as a JSON object; 400 / 413 / 415 in the client's error format otherwise."""
        return await net.read_json(request, json_only=True)

    @staticmethod
    def session_id(request: web.Request) -> str:
        """The harness hands the session id to the CLI as its API key (x-api-key or a bearer token)."""
        key = request.headers.get("x-api-key", "").strip()
        if not key:
            auth = request.headers.get("authorization", "").strip()
            if auth.lower().startswith("bearer "):
                key = auth[7:].strip()
        if not key:
            raise ApiError(401, "missing API key: send the session id as x-api-key or a bearer token")
        return key

    def admit(self, sid: str) -> None:
        try:
            self.manager.begin_turn(sid)
        except SessionClosed:
            raise ApiError(503, f"session {sid[:64]!r} is closed", retry=False) from None
        except TooManyTurns:
            raise ApiError(429, f"session {sid[:64]!r} reached agent.max_turns={self.manager.max_turns}",
                           retry=False) from None

    async def render(self, req: TurnRequest) -> list[int]:
        try:
            return await asyncio.to_thread(self.renderer.render, req.messages, req.tools)
        except Exception as exc:  # the template rejected this conversation shape
            raise ApiError(400, f"cannot render the conversation with the chat template: {str(exc)[:300]}") from exc

    async def run_turn(self, req: TurnRequest, constraint: dict[str, str] | None = None,
                       session: str | None = None) -> TurnResult:
        """Render, clamp to the context window, generate (or not, at the limit), parse."""
        return await self.generate_turn(req, await self.render(req), constraint, session)

    async def generate_turn(self, req: TurnRequest, prompt_ids: list[int], constraint: dict[str, str] | None = None,
                            session: str | None = None, on_progress: Progress | None = None) -> TurnResult:
        """Clamp to the context window, generate (streamed to `on_progress` if given), parse."""
        remaining = self.renderer.context_len - len(prompt_ids)
        capped = False
        engine_s = 0.0
        wanted = req.max_tokens if req.max_tokens is not None else self.settings.agent.max_new_tokens
        context_limited = remaining < min(wanted, self.settings.agent.max_new_tokens)
        if remaining <= 0:
            gen = Generation([], [], "length")
        else:
            max_new = max(1, min(wanted, self.settings.agent.max_new_tokens, remaining))
            # A turn cut by our own cap ends normally for the client (a CLI told max_tokens retries or fails);
            # the recorded turn keeps finish_reason=length, so the sample is still marked truncated.
            # A client that set no limit (Codex sends no max_output_tokens) is only ever cut by our cap or the window.
            asked = req.max_tokens if req.max_tokens is not None else remaining
            capped = max_new == self.settings.agent.max_new_tokens < min(asked, remaining)
            params: dict[str, Any] = {
                "max_new_tokens": max_new,
                "temperature": self.settings.rollout.temperature, "top_p": self.settings.rollout.top_p,
                "top_k": self.settings.rollout.top_k,
                "stop_token_ids": sorted(self.renderer.stop_ids), "skip_special_tokens": False,
                "spaces_between_special_tokens": False, "no_stop_trim": True}
            if req.stop:
                params["stop"] = req.stop
            if on_progress is not None:
                params["stream_interval"] = self.settings.stream_interval
            params.update(constraint or {})
            started = time.perf_counter()
            try:
                gen = await self.engine.generate(prompt_ids, params, rid=f"{self.name}-{uuid.uuid4().hex}",
                                                 session=session, on_progress=on_progress)
            except EngineRejected as exc:  # a bad request, most likely a tool schema the grammar cannot hold
                what = f" (agent.constrain={self.settings.agent.constrain})" if constraint else ""
                raise ApiError(400, f"the engine rejected this turn{what}: {exc.message[:1000]}", retry=False
                               ) from None
            engine_s = time.perf_counter() - started
            if gen.finish_reason == "abort":  # e.g. paused for a weight update: not a turn, let the CLI retry
                raise ApiError(503, "the engine aborted this generation; retry", retry=True)
        text = self.renderer.decode(gen.output_ids)
        stop_sequence = gen.matched if isinstance(gen.matched, str) and gen.matched in req.stop else None
        if stop_sequence and text.endswith(stop_sequence):
            text = text[: -len(stop_sequence)]
        return TurnResult(prompt_ids, gen, self.parser.parse(text), stop_sequence, capped, context_limited, engine_s,
                          bool(constraint))

    async def serve_turn(self, request: web.Request, sid: str, req: TurnRequest, reply: Any) -> web.StreamResponse:
        """Admit, run, send the reply with `reply(request, result)`, then record; always release the slot."""
        constraint = self.constraint(sid, req)  # a request that cannot be constrained costs no turn
        self.admit(sid)
        turn: Turn | None = None
        try:
            result = await self.run_turn(req, constraint, session=sid)
            response = await reply(request, result)
            turn = result.to_turn()
            return response
        finally:
            self.manager.end_turn(sid, turn)

    async def stream_turn(self, request: web.Request, sid: str, req: TurnRequest, writer: StreamWriter
                          ) -> web.StreamResponse:
        """serve_turn for a streaming request: the SSE stream opens with the engine's first chunk, shows the
        output as it comes (LiveText), and the turn is recorded once the last event was written."""
        constraint = self.constraint(sid, req)
        self.admit(sid)
        turn: Turn | None = None
        resp: web.StreamResponse | None = None
        live = LiveText(getattr(self.parser, "stream_view", None), req.stop, self.renderer.decode)
        last_write = time.monotonic()
        try:
            prompt_ids = await self.render(req)

            async def send(make: Callable[[], list[bytes]]) -> None:
                """Open the stream (its opening events first), then write what `make` gives."""
                nonlocal resp, last_write
                chunks = []
                if resp is None:
                    resp = await open_sse(request)
                    chunks = writer.opening(len(prompt_ids))
                chunks += make()
                if chunks:
                    await resp.write(b"".join(chunks))
                    last_write = time.monotonic()

            def shown(ids: list[int]) -> list[bytes]:
                reasoning, delta = live.update(ids)
                chunks = (writer.reasoning(reasoning) if reasoning else []) + (writer.text(delta) if delta else [])
                if not chunks and time.monotonic() - last_write >= KEEPALIVE_S:
                    chunks = writer.keepalive()
                return chunks

            async def progress(ids: list[int]) -> None:
                await send(lambda: shown(ids))

            try:
                result = await self.generate_turn(req, prompt_ids, constraint, sid, on_progress=progress)
            except ConnectionResetError:  # the client went away mid-stream (the engine request was aborted)
                raise
            except Exception as exc:
                if resp is None:
                    raise  # nothing sent yet: an HTTP error as for a non-streaming request
                err = self._refusal(request, exc)
                if err is None:
                    log.exception("internal error in a streamed turn")
                    err = net.HttpError(500, f"internal error: {type(exc).__name__}: {exc}")
                await send(lambda: writer.failure(err.status, err.message))
                await resp.write_eof()
                return resp
            await send(lambda: writer.finish(result, live))
            assert resp is not None
            await resp.write_eof()
            turn = result.to_turn()
            return resp
        except ConnectionResetError:
            if resp is None:
                raise
            return resp  # nothing to answer: aiohttp closes the connection
        finally:
            self.manager.end_turn(sid, turn)


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


async def send_json(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    """Write a JSON reply completely before returning (so the turn can be recorded as delivered)."""
    response = web.Response(text=json.dumps(body), content_type="application/json")
    await response.prepare(request)
    await response.write_eof()
    return response
