"""What slimecli's HTTP servers share: JSON errors, body-size limits and one JSON body reader.

The engine, the teacher and the agent adapters each answer errors in their own wire format (SGLang's
`{"error": {"message": ...}}`, the teacher's `{"error": "..."}`, Anthropic's and OpenAI's error objects);
the mechanics are one. `json_errors(format_error)` is a middleware that turns every refusal into a JSON
body of the server's format: an `HttpError` (what `read_json` raises), aiohttp's own 404/405/413, and the
server's own exceptions that its `translate` maps. Anything else is a bug of ours: a 500 JSON body, with the
traceback in the log. A client never gets an HTML page, and never a 500 for a mistake of its own.

`read_json` reads a request body: over the app's `client_max_size` is 413, a declared non-JSON content
type 415 (where the server asks for it), and an empty body, invalid UTF-8 or JSON, NaN/Infinity, a
top-level value that is not an object, nesting deeper than `MAX_DEPTH` or an integer too long to convert
are 400.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware

# Body limits (aiohttp's client_max_size), sized per server.
ENGINE_MAX_BODY = 512 << 20  # /generate with batched input_ids and long prompts; weight-update manifests
TEACHER_MAX_BODY = 512 << 20  # one long sequence with its label_token_ids matrix
ADAPTER_MAX_BODY = 32 << 20  # one agent turn: the conversation so far and its tool definitions
MAX_DEPTH = 64  # nesting of objects and arrays a body may have (tool schemas need about a dozen)

ErrorFormatter = Callable[["HttpError"], Mapping[str, Any]]
Translator = Callable[[web.Request, Exception], "HttpError | None"]


class HttpError(Exception):
    """A request answered with `status` and a message for the client, in the server's error format."""

    def __init__(self, status: int, message: str, *, kind: str | None = None,
                 headers: Mapping[str, str] | None = None, extra: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind  # the API's own error type, where its format has one (the adapters)
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})  # more fields for the body (the teacher's input_length, ...)


def json_errors(format_error: ErrorFormatter, *, logger: logging.Logger,
                translate: Translator | None = None) -> Middleware:
    """A middleware answering every error as `format_error(HttpError)` JSON with the error's status.

    `translate(request, exc)` maps a server's own exceptions to an HttpError (None: not a refusal, a bug).
    A client that went away (CancelledError, ConnectionResetError) is not answered.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except HttpError as exc:
            err = exc
        except web.HTTPException as exc:  # aiohttp's own: 404 / 405 / 413 ...
            if exc.status < 400:
                raise
            err = HttpError(exc.status, exc.reason or "error")
        except Exception as exc:
            mapped = translate(request, exc) if translate is not None else None
            if mapped is None:
                logger.exception("internal error on %s %s", request.method, request.path)
                mapped = HttpError(500, f"internal error: {type(exc).__name__}: {exc}")
            err = mapped
        return web.json_response(dict(format_error(err)), status=err.status, headers=err.headers or None)

    return middleware


def is_json_type(content_type: str) -> bool:
    """application/json or application/*+json; application/octet-stream (bytes of no declared kind) too."""
    ct = content_type.split(";", 1)[0].strip().lower()
    return ct in ("application/json", "application/octet-stream") or (ct.startswith("application/")
                                                                       and ct.endswith("+json"))


async def read_json(request: web.Request, required: bool = True, *, json_only: bool = False,
                    max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """The request's body as a JSON object; HttpError 400/413/415 naming what is wrong with it.

    required=False: an empty body is {}. json_only: a Content-Type that is given must be JSON (a body
    sent without one, or as application/octet-stream, is read as JSON).
    """
    declared = request.headers.get(hdrs.CONTENT_TYPE)
    if json_only and declared and not is_json_type(declared):
        raise HttpError(415, f"body: Content-Type must be application/json (got {declared[:100]})")
    limit = request.client_max_size
    if limit and request.content_length is not None and request.content_length > limit:
        raise HttpError(413, f"body: {request.content_length} bytes, over this server's limit of {limit}")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise HttpError(413, f"body: over this server's limit of {limit} bytes") from None
    return parse_json_object(raw, required=required, max_depth=max_depth)


def parse_json_object(raw: bytes, *, required: bool = True, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """`raw` parsed as a JSON object (see read_json); HttpError 400 otherwise."""
    if not raw.strip():
        if required:
            raise HttpError(400, "body: empty (a JSON object is required)")
        return {}
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HttpError(400, f"body: not valid JSON: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        body = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise HttpError(400, f"body: nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # JSONDecodeError, NaN / Infinity, an integer over Python's digit limit
        raise HttpError(400, f"body: not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(body, dict):
        raise HttpError(400, f"body: must be a JSON object (got {_json_type(body)})")
    if _too_deep(raw, body, max_depth):
        raise HttpError(400, f"body: nested deeper than {max_depth} levels")
    return body


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "a number"


def _too_deep(raw: bytes, body: dict[str, Any], limit: int) -> bool:
    if raw.count(b"{") + raw.count(b"[") <= limit:  # cannot nest deeper than it has brackets
        return False
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False
