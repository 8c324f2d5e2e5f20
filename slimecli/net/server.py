"""What slimecli's HTTP servers share: JSON errors, body-size limits and one JSON body reader.

The engine, the teacher and the agent adapters each answer errors in their own wire format (SGLang's
`{"error": {"message": ...}}`, the teacher's `{"error": "..."}`, Anthropic's and OpenAI's error objects);
the mechanics are one. `json_errors(format_error)` is a middleware that turns every refusal into a JSON
body of the server's format: an `HttpError` (what `read_json` raises), aiohttp's own 404/405/413, and the
server's own exceptions that its `translate` maps. Anything else is a bug of ours: a 500 JSON body, with the
traceback in the log. A client never gets an HTML page, and never a 500 for a mistake of its own.

`read_json` reads a request body: over the server's body limit (`BodyLimits` on the app, else the app's
`client_max_size`) is 413, a declared non-JSON content type 415 (where the server asks for it), a body that
stalls for longer than the limits' `body_timeout_s` 408, and a body that does not match its Content-Encoding,
an empty body, invalid UTF-8 or JSON, NaN/Infinity (also as a number too large for a float, 1e999), a
top-level value that is not an object, nesting deeper than `MAX_DEPTH`, an integer too long to convert or
(with `strict_text`) a lone UTF-16 surrogate in any string are 400.

`dumps` writes reply bodies: never a NaN or Infinity literal (not JSON); a non-finite float becomes null,
as SGLang's orjson writes it. (Request fields are checked by the one decoder, slimecli.config.decode.)
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.util
import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import hdrs, http_exceptions, web
from aiohttp.typedefs import Handler, Middleware
from aiohttp.web_protocol import RequestPayloadError

# Outer body caps (aiohttp's client_max_size). The engine and the teacher size their real limit from the
# model's context length once it is known (body_limit below, kept in the app's BodyLimits).
ENGINE_MAX_BODY = 512 << 20  # outer cap only; see body_limit
TEACHER_MAX_BODY = 512 << 20  # outer cap only; see body_limit
ADAPTER_MAX_BODY = 32 << 20  # one agent turn: the conversation so far and its tool definitions
MAX_DEPTH = 64  # nesting of objects and arrays a body may have (tool schemas need about a dozen)
BYTES_PER_TOKEN = 16  # JSON bytes one token may take in a body: "123456, " or a few characters of text
MIN_BODY = 1 << 20  # small control bodies and short prompts always fit
BODY_TIMEOUT_S = 60.0  # a body that has not arrived this long after its headers is refused (408)


def body_limit(tokens: int, per_token: int = BYTES_PER_TOKEN, *, floor: int = MIN_BODY,
               cap: int = ENGINE_MAX_BODY) -> int:
    """Bytes a body may have to carry `tokens` tokens (context length x how many a request may hold)."""
    return max(floor, min(cap, tokens * per_token + floor))


@dataclass
class BodyLimits:
    """A server's body limits; read_json uses the app's (`app[BODY_LIMITS]`) when it has one. Mutable:
    a server that learns its context length when the model has loaded raises max_bytes then."""

    max_bytes: int = MIN_BODY
    body_timeout_s: float = BODY_TIMEOUT_S


BODY_LIMITS = web.AppKey("slimecli_body_limits", BodyLimits)

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
        return json_response(dict(format_error(err)), status=err.status, headers=err.headers or None)

    return middleware


def is_json_type(content_type: str) -> bool:
    """application/json or application/*+json; application/octet-stream (bytes of no declared kind) too."""
    ct = content_type.split(";", 1)[0].strip().lower()
    return ct in ("application/json", "application/octet-stream") or (ct.startswith("application/")
                                                                       and ct.endswith("+json"))


async def read_json(request: web.Request, required: bool = True, *, json_only: bool = False,
                    max_depth: int = MAX_DEPTH, strict_text: bool = False) -> dict[str, Any]:
    """The request's body as a JSON object; HttpError 400/408/413/415 naming what is wrong with it.

    required=False: an empty body is {}. json_only: a Content-Type that is given must be JSON (a body
    sent without one, or as application/octet-stream, is read as JSON). strict_text: a string with a lone
    UTF-16 surrogate anywhere in the body is a 400 naming where.
    """
    declared = request.headers.get(hdrs.CONTENT_TYPE)
    if json_only and declared and not is_json_type(declared):
        raise HttpError(415, f"body: Content-Type must be application/json (got {declared[:100]})")
    coding = request.headers.get(hdrs.CONTENT_ENCODING, "").strip().lower()
    if coding and coding not in decodable_codings():
        raise HttpError(415, f"body: Content-Encoding {coding[:60]!r} is not supported "
                             f"(supported: {', '.join(sorted(decodable_codings() - {'identity'}))})")
    limits = _limits(request)
    limit = min((x for x in (request.client_max_size, limits.max_bytes if limits else 0) if x), default=0)
    if limit and request.content_length is not None and request.content_length > limit:
        raise HttpError(413, f"body: {request.content_length} bytes, over this server's limit of {limit}")
    timeout = limits.body_timeout_s if limits else BODY_TIMEOUT_S
    try:
        async with asyncio.timeout(timeout):
            raw = await _read_limited(request, limit)
    except TimeoutError:
        raise HttpError(408, f"body: not received within {timeout:g}s") from None
    except web.HTTPRequestEntityTooLarge:
        raise HttpError(413, f"body: over this server's limit of {limit} bytes") from None
    except (http_exceptions.HttpProcessingError, RequestPayloadError, ValueError) as exc:  # bad gzip, a broken chunk
        raise HttpError(400, f"body: cannot be read as sent (Content-Encoding / Content-Length / chunks): "
                             f"{str(exc)[:200] or type(exc).__name__}") from None
    return parse_json_object(raw, required=required, max_depth=max_depth, strict_text=strict_text)


@functools.cache
def decodable_codings() -> frozenset[str]:
    """The Content-Encodings aiohttp decodes here (one coding; br and zstd only with their libraries)."""
    codings = {"identity", "gzip", "deflate"}
    for coding, modules in (("br", ("brotli", "brotlicffi")), ("zstd", ("backports.zstd", "compression.zstd"))):
        if any(importlib.util.find_spec(m.split(".")[0]) is not None and _importable(m) for m in modules):
            codings.add(coding)
    return frozenset(codings)


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def _limits(request: web.Request) -> BodyLimits | None:
    try:
        return request.app.get(BODY_LIMITS)
    except (AttributeError, RuntimeError):  # a request outside an application (tests)
        return None


async def _read_limited(request: web.Request, limit: int) -> bytes:
    """The body, refused (413) as soon as more than `limit` bytes have arrived (decoded size)."""
    encoded = bool(request.headers.get(hdrs.CONTENT_ENCODING, "").strip())
    if (request.content_length is not None and not encoded) or not limit:
        return await request.read()  # aiohttp checks client_max_size; the declared length was checked above
    # no declared length, or a compressed one: count what arrives decoded (a zip bomb stops at the limit)
    chunks, size = [], 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=size)
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json_object(raw: bytes, *, required: bool = True, max_depth: int = MAX_DEPTH,
                      strict_text: bool = False) -> dict[str, Any]:
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
        body = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise HttpError(400, f"body: nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # JSONDecodeError, NaN / Infinity, an integer over Python's digit limit
        raise HttpError(400, f"body: not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(body, dict):
        raise HttpError(400, f"body: must be a JSON object (got {_json_type(body)})")
    if _too_deep(raw, body, max_depth):
        raise HttpError(400, f"body: nested deeper than {max_depth} levels")
    if strict_text and (b"\\ud" in raw or b"\\uD" in raw) and (where := lone_surrogate(body)) is not None:
        raise HttpError(400, f"{where}: contains a lone UTF-16 surrogate (not valid Unicode text)")
    return body


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is too large for a float")
    return value


def lone_surrogate(value: Any, where: str = "body") -> str | None:
    """Where (a field path such as `text[2]`) the first string with a lone UTF-16 surrogate is, or None."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            if not node.isascii():
                try:
                    node.encode("utf-8")
                except UnicodeEncodeError:
                    return path
        elif isinstance(node, dict):
            for k, v in node.items():
                sub = k if path == "body" else f"{path}.{k}"
                stack.append((k, f"{sub} (key)"))
                stack.append((v, sub))
        elif isinstance(node, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(node))
    return None


def _nulls(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _nulls(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_nulls(v) for v in value]
    return value


def dumps(obj: Any) -> str:
    """JSON text of a reply, compact; non-finite floats become null (never a NaN / Infinity literal)."""
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return json.dumps(_nulls(obj), separators=(",", ":"), allow_nan=False)


def json_response(obj: Any, *, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """web.json_response written with `dumps`."""
    return web.json_response(obj, status=status, headers=headers, dumps=dumps)


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
