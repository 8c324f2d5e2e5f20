"""Bearer-token authentication of a server's endpoints, SGLang's `--api-key` convention.

With a key set, a request must carry `Authorization: Bearer KEY` (the scheme in any case) or, as SGLang also
accepts, `x-api-key: KEY`; anything else is a 401 JSON error in the server's format (raised as an HttpError
for the server's json_errors middleware, which must come first). OPTIONS and the paths `open_path` accepts
stay open: SGLang leaves /health*, /ready* and /metrics* open so that probes need no secret.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable, Mapping

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from slimecli.net.server import HttpError

SGLANG_OPEN_PREFIXES = ("/health", "/ready", "/metrics")
API_KEY_ENV = "SLIMECLI_ENGINE_API_KEY"
JUDGE_API_KEY_ENV = "SLIMECLI_JUDGE_API_KEY"


def engine_api_key(configured: str | None = None) -> str | None:
    """The engines' api key: the configured one (rollout.api_key), else $SLIMECLI_ENGINE_API_KEY, else None."""
    return configured or os.environ.get(API_KEY_ENV) or None


def judge_api_key(configured: str | None = None) -> str | None:
    """reward=judge's api key, sent to the judge and required by an embedded one: reward.judge_api_key, else
    $SLIMECLI_JUDGE_API_KEY, else None."""
    return configured or os.environ.get(JUDGE_API_KEY_ENV) or None


def sglang_open_path(path: str) -> bool:
    """The paths SGLang's API-key middleware lets through without a key."""
    return path.startswith(SGLANG_OPEN_PREFIXES)


def _same(given: str, key: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), key.encode("utf-8", "surrogateescape"))


def authorized(headers: Mapping[str, str], key: str) -> bool:
    """Whether the request headers carry `key` (Bearer, or x-api-key)."""
    auth = headers.get("Authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and _same(token.strip(), key):
        return True
    x_key = headers.get("x-api-key")
    return x_key is not None and _same(x_key, key)


def bearer_auth(key: Callable[[], str | None] | str | None, *, open_path: Callable[[str], bool] = sglang_open_path,
                what: str = "the api key") -> Middleware:
    """A middleware refusing requests without `key` (a string, or a function read per request; None/"" = off)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        expected = key() if callable(key) else key
        if expected and request.method != "OPTIONS" and not open_path(request.path):
            if not authorized(request.headers, expected):
                raise HttpError(401, f"Unauthorized: missing or wrong key (send Authorization: Bearer <{what}>)",
                                kind="authentication_error", headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    return middleware
