"""The shared HTTP plumbing: the JSON error middleware, the body reader and the retry loop."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from slimecli.net.probe import poll_delays
from slimecli.net.retry import (
    HttpStatusError,
    RetryPolicy,
    TransientError,
    describe,
    is_retryable,
    retryable_status,
    with_retries,
)
from slimecli.net.server import HttpError, json_errors, parse_json_object, read_json

# ---- retries ------------------------------------------------------------------------------------------


class Clock:
    """A fake monotonic clock that the fake sleep advances; records every delay."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def failing(*errors: BaseException, result: Any = "ok") -> tuple[Any, list[int]]:
    calls = [0]

    async def attempt() -> Any:
        calls[0] += 1
        if calls[0] <= len(errors):
            raise errors[calls[0] - 1]
        return result

    return attempt, calls


def run(attempt: Any, policy: RetryPolicy, clock: Clock, rand: float = 0.5, **kw: Any) -> Any:
    return asyncio.run(with_retries(attempt, policy, sleep=clock.sleep, rand=lambda: rand, clock=clock, **kw))


def test_retries_back_off_exponentially_with_a_cap_then_succeed():
    clock = Clock()
    attempt, calls = failing(HttpStatusError(503), TimeoutError(), aiohttp.ClientConnectionError(),
                             HttpStatusError(429), HttpStatusError(408))
    policy = RetryPolicy(max_retries=5, backoff_s=0.5, backoff_max_s=3.0)
    assert run(attempt, policy, clock) == "ok" and calls[0] == 6
    assert clock.sleeps == [0.5, 1.0, 2.0, 3.0, 3.0]  # rand 0.5: jitter factor 1


def test_jitter_is_uniform_in_half_to_one_and_a_half_of_the_capped_base():
    policy = RetryPolicy(backoff_s=1.0, backoff_max_s=4.0)
    assert policy.delay(0, lambda: 0.0) == 0.5 and policy.delay(0, lambda: 0.999) == pytest.approx(1.499)
    assert policy.delay(1, lambda: 0.0) == 1.0 and policy.delay(5, lambda: 0.0) == 2.0  # 32 capped at 4
    assert policy.delay(5, lambda: 0.999) == pytest.approx(4 * 1.499)


def test_spent_retries_raise_the_last_error_as_it_is():
    clock = Clock()
    attempt, calls = failing(*[HttpStatusError(500, f"try {i}") for i in range(10)])
    with pytest.raises(HttpStatusError, match="try 2") as info:
        run(attempt, RetryPolicy(max_retries=2, backoff_s=0.1), clock)
    assert calls[0] == 3 and len(clock.sleeps) == 2
    assert is_retryable(info.value) and describe(info.value) == "HTTP 500: try 2"


@pytest.mark.parametrize("exc", [HttpStatusError(400), HttpStatusError(404), HttpStatusError(401),
                                 ValueError("bad reply"), KeyError("x")])
def test_other_4xx_and_other_errors_are_not_retried(exc):
    clock = Clock()
    attempt, calls = failing(exc)
    with pytest.raises(type(exc)):
        run(attempt, RetryPolicy(max_retries=5), clock)
    assert calls[0] == 1 and clock.sleeps == []


def test_classification():
    assert all(retryable_status(s) for s in (408, 429, 500, 502, 503, 504))
    assert not any(retryable_status(s) for s in (400, 401, 403, 404, 409, 413, 422))
    assert is_retryable(TransientError("reply is not JSON")) and is_retryable(ConnectionRefusedError())
    assert is_retryable(aiohttp.ServerDisconnectedError()) and is_retryable(TimeoutError())
    assert describe(TimeoutError("slow")) == "TimeoutError: slow"


def test_a_time_budget_bounds_unlimited_retries():
    clock = Clock()
    attempt, calls = failing(*[HttpStatusError(503)] * 100)
    policy = RetryPolicy(max_retries=None, backoff_s=0.2, backoff_max_s=0.2, timeout_s=1.0)
    with pytest.raises(HttpStatusError):
        run(attempt, policy, clock)
    assert clock.sleeps == [0.2] * 5 and calls[0] == 6  # no retry starts after 1.0 s
    with pytest.raises(ValueError, match="max_retries or timeout_s"):
        RetryPolicy(max_retries=None)


def test_a_custom_predicate_decides_what_is_retried():
    clock = Clock()
    attempt, calls = failing(KeyError("busy"), KeyError("busy"))
    assert run(attempt, RetryPolicy(max_retries=3), clock, retryable=lambda e: isinstance(e, KeyError)) == "ok"
    assert calls[0] == 3


def test_readiness_polls_start_quick_and_slow_down_to_their_period():
    delays = list(itertools.islice(poll_delays(0.5), 12))
    assert delays[0] == 0.05 and delays[-1] == 0.5 and max(delays) == 0.5
    assert all(b == min(0.5, a * 1.5) for a, b in zip(delays, delays[1:], strict=False))
    assert sum(delays[:4]) < 0.5  # four polls in the first half second: a quick server is seen soon after it is up
    assert next(poll_delays(0.01)) == 0.01  # a period shorter than the first wait is the wait


def test_zero_retries_is_one_attempt():
    clock = Clock()
    attempt, calls = failing(HttpStatusError(503))
    with pytest.raises(HttpStatusError):
        run(attempt, RetryPolicy(max_retries=0), clock)
    assert calls[0] == 1 and RetryPolicy(max_retries=0).attempts == 1


# ---- server: errors and bodies ------------------------------------------------------------------------


class Refused(Exception):
    pass


def shape(err: HttpError) -> dict[str, Any]:
    return {"error": {"message": err.message, "kind": err.kind, **err.extra}}


def translate(request: web.Request, exc: Exception) -> HttpError | None:
    return HttpError(409, f"refused: {exc}", kind="conflict") if isinstance(exc, Refused) else None


def make_app(max_body: int = 1 << 16, json_only: bool = True) -> web.Application:
    async def echo(request: web.Request) -> web.Response:
        return web.json_response(await read_json(request, json_only=json_only))

    async def optional(request: web.Request) -> web.Response:
        return web.json_response(await read_json(request, required=False))

    async def refuse(request: web.Request) -> web.Response:
        raise Refused("no")

    async def teapot(request: web.Request) -> web.Response:
        raise HttpError(418, "short and stout", headers={"x-should-retry": "false"}, extra={"n": 1})

    async def bug(request: web.Request) -> web.Response:
        return web.json_response({}[request.path])  # KeyError: a bug of ours

    app = web.Application(middlewares=[json_errors(shape, logger=logging.getLogger("test.net"),
                                                   translate=translate)], client_max_size=max_body)
    app.router.add_post("/echo", echo)
    app.router.add_post("/optional", optional)
    for path, fn in [("/refuse", refuse), ("/teapot", teapot), ("/bug", bug)]:
        app.router.add_get(path, fn)
    return app


def call(requests: list[tuple[str, str, bytes | None, dict[str, str]]], **app_kw: Any) -> list[tuple[int, Any, Any]]:
    async def main() -> list[tuple[int, Any, Any]]:
        async with TestClient(TestServer(make_app(**app_kw))) as client:
            out = []
            for method, path, data, headers in requests:
                skip = [] if "Content-Type" in headers else ["Content-Type"]
                async with client.request(method, path, data=data, headers=headers, skip_auto_headers=skip) as r:
                    text = await r.text()
                    assert r.content_type == "application/json", (path, r.status, text)
                    out.append((r.status, json.loads(text), r.headers))
            return out

    return asyncio.run(main())


JSON = {"Content-Type": "application/json"}


@pytest.mark.parametrize(("raw", "status", "words"), [
    (b"", 400, "empty"),
    (b"   ", 400, "empty"),
    (b"{bad", 400, "not valid JSON"),
    (b"\xff\xfe{}", 400, "not UTF-8"),
    (b"[1, 2]", 400, "must be a JSON object (got an array)"),
    (b'"text"', 400, "got a string"),
    (b"null", 400, "got null"),
    (b"7", 400, "got a number"),
    (b'{"x": NaN}', 400, "NaN is not a JSON value"),
    (b'{"x": -Infinity}', 400, "Infinity is not a JSON value"),
    (b'{"x": ' + b"9" * 5000 + b"}", 400, "not valid JSON"),  # over Python's int digit limit
    (b'{"x": ' + b"[" * 65 + b"]" * 65 + b"}", 400, "nested deeper than 64"),
    (b'{"x": ' + b"[" * 100000 + b"]" * 100000 + b"}", 400, "nested deeper than 64"),  # the parser's recursion
])
def test_bad_bodies_are_400_naming_the_problem(raw, status, words):
    [(got, body, _)] = call([("POST", "/echo", raw, JSON)], max_body=1 << 20)
    assert got == status and words in body["error"]["message"], body


def test_good_bodies_and_the_limits():
    deep_ok = b'{"x": ' + b"[" * 63 + b"]" * 63 + b"}"
    brackets_in_strings = json.dumps({"s": "[" * 500, "t": [{"a": [1]}] * 100}).encode()
    out = call([
        ("POST", "/echo", b'{"a": [1, {"b": 2}]}', JSON),
        ("POST", "/echo", b'{"a": 1}', {}),  # no Content-Type: read as JSON
        ("POST", "/echo", b'{"a": 1}', {"Content-Type": "application/octet-stream"}),
        ("POST", "/echo", b'{"a": 1}', {"Content-Type": "application/vnd.api+json; charset=utf-8"}),
        ("POST", "/echo", deep_ok, JSON),
        ("POST", "/echo", brackets_in_strings, JSON),
        ("POST", "/echo", b'{"a": 1}', {"Content-Type": "text/plain"}),
        ("POST", "/echo", b'{"a": "' + b"x" * (1 << 16) + b'"}', JSON),
        ("POST", "/optional", b"", {}),
    ])
    assert [s for s, _, _ in out] == [200, 200, 200, 200, 200, 200, 415, 413, 200]
    assert out[0][1] == {"a": [1, {"b": 2}]} and out[8][1] == {}
    assert "Content-Type must be application/json (got text/plain)" in out[6][1]["error"]["message"]
    assert "limit of 65536" in out[7][1]["error"]["message"]


def test_a_lenient_server_reads_any_content_type():
    [(status, body, _)] = call([("POST", "/echo", b'{"a": 1}', {"Content-Type": "text/plain"})], json_only=False)
    assert status == 200 and body == {"a": 1}


def test_every_error_is_json_in_the_servers_shape(caplog):
    with caplog.at_level(logging.ERROR, logger="test.net"):
        out = call([("GET", "/refuse", None, {}), ("GET", "/teapot", None, {}), ("GET", "/bug", None, {}),
                    ("GET", "/nowhere", None, {}), ("GET", "/echo", None, {})])
    (refuse, teapot, bug, missing, method) = out
    assert refuse[:2] == (409, {"error": {"message": "refused: no", "kind": "conflict"}})
    assert teapot[:2] == (418, {"error": {"message": "short and stout", "kind": None, "n": 1}})
    assert teapot[2]["x-should-retry"] == "false"
    assert bug[0] == 500 and bug[1]["error"]["message"].startswith("internal error: KeyError")
    assert missing[:2] == (404, {"error": {"message": "Not Found", "kind": None}})
    assert method[0] == 405
    assert "internal error on GET /bug" in caplog.text and "Traceback" in caplog.text
    assert "/refuse" not in caplog.text  # a refusal is not a bug


def test_parse_json_object_without_a_server():
    assert parse_json_object(b'{"a": 1}') == {"a": 1}
    assert parse_json_object(b"", required=False) == {}
    with pytest.raises(HttpError, match="nested deeper than 2"):
        parse_json_object(b'{"a": {"b": {}}}', max_depth=2)
