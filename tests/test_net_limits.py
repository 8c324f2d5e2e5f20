"""The shared server limits without a server: strict JSON, finite replies, request paths, the connection cap."""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
from pathlib import Path

import pytest
from aiohttp import web

from slimecli.net.auth import authorized, sglang_open_path
from slimecli.net.listen import app_runner, start_site
from slimecli.net.paths import request_dir
from slimecli.net.server import HttpError, body_limit, dumps, lone_surrogate, parse_json_object


@pytest.mark.parametrize("raw, words", [
    (b'{"t": 1e999}', "too large"), (b'{"t": -1e400}', "too large"), (b'{"t": NaN}', "NaN"),
    (b'{"t": ' + b"1" * 5000 + b"}", "not valid JSON"), (b'{"a": "\\ud800"}', "a: contains a lone"),
    (b'{"a": [{"b": "x\\udfffy"}]}', "a[0].b"), (b'{"\\udc00": 1}', "(key)")])
def test_strict_parse(raw: bytes, words: str) -> None:
    with pytest.raises(HttpError) as info:
        parse_json_object(raw, strict_text=True)
    assert info.value.status == 400 and words in info.value.message


def test_surrogate_pairs_and_lenient_parse() -> None:
    assert parse_json_object(b'{"a": "\\ud83d\\ude00"}', strict_text=True) == {"a": "\U0001f600"}
    assert parse_json_object(b'{"a": "\\ud800"}') == {"a": "\ud800"}  # the adapters' default: not checked
    assert lone_surrogate({"x": ["ok", {"y": "\ud800"}]}) == "x[1].y"
    assert lone_surrogate(["fine", 1, None]) is None


def test_replies_are_strict_json() -> None:
    text = dumps({"a": [math.nan, math.inf, -math.inf, 1.5], "b": (2.0,)})
    assert json.loads(text, parse_constant=lambda c: pytest.fail(c)) == {"a": [None, None, None, 1.5], "b": [2.0]}
    assert dumps({"x": 1}) == '{"x":1}'


def test_body_limit_scales_with_tokens() -> None:
    assert body_limit(0) == 1 << 20
    assert body_limit(1000) == 1000 * 16 + (1 << 20)
    assert body_limit(10 ** 12) == 512 << 20  # capped


def test_request_dir(tmp_path: Path) -> None:
    inside = tmp_path / "root" / "ckpt"
    inside.mkdir(parents=True)
    (tmp_path / "out").mkdir()
    (tmp_path / "root" / "link").symlink_to(tmp_path / "out")
    roots = [tmp_path / "root"]
    assert request_dir(str(inside), "model_path", roots) == inside.resolve()
    assert request_dir(str(tmp_path / "root"), "model_path", roots) == (tmp_path / "root").resolve()
    for bad, status in ((str(tmp_path / "root" / "link"), 403), (str(tmp_path / "root" / ".." / "out"), 403),
                        (str(tmp_path / "rootx"), 403), ("~nosuchuser-x/y", 400), ("a" * 5000, 400),
                        ("/" + "b" * 256, 400), ("x\x00", 400), (5, 400), ("", 400)):
        with pytest.raises(HttpError) as info:
            request_dir(bad, "model_path", roots)
        assert info.value.status == status, bad
    assert request_dir("~", "p") == Path(os.path.expanduser("~")).resolve()  # no roots: any directory


def test_auth_headers() -> None:
    assert authorized({"Authorization": "Bearer k"}, "k") and authorized({"Authorization": "bEaReR k"}, "k")
    assert not authorized({"Authorization": "Bearer kk"}, "k") and not authorized({}, "k")
    assert authorized({"x-api-key": "k"}, "k") and not authorized({"Authorization": "Bearer \u00e9"}, "k")
    assert sglang_open_path("/health_generate") and sglang_open_path("/metrics") and not sglang_open_path("/generate")


def test_connection_cap_answers_503() -> None:
    async def main() -> None:
        app = web.Application()
        async def ok(request: web.Request) -> web.Response:
            return web.Response(text="ok")

        app.router.add_get("/", ok)
        runner = app_runner(app, read_timeout_s=30)
        await runner.setup()
        site = await start_site(runner, "127.0.0.1", 0, max_connections=2)
        held = [socket.create_connection(("127.0.0.1", site.port)) for _ in range(2)]
        try:
            for _ in range(100):  # until the server has registered both
                if len(runner.server.connections) == 2:  # type: ignore[union-attr]
                    break
                await asyncio.sleep(0.02)
            reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            data = await asyncio.wait_for(reader.read(), 30)
            assert data.startswith(b"HTTP/1.1 503") and b"too many open connections" in data
            writer.close()
        finally:
            for s in held:
                s.close()
            await runner.cleanup()

    asyncio.run(main())
