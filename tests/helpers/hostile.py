"""Raw HTTP for the hostile-input suites: bytes on a socket, so a test can send what no client library would
(a lying Content-Length, a stalled head, a body that is not what its Content-Encoding says)."""

from __future__ import annotations

import json
import math
import re
import socket
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st


@dataclass
class Reply:
    status: int  # 0: the server closed the connection without an answer
    head: str
    body: bytes

    def json(self) -> Any:
        return strict_json(self.body)


def strict_json(raw: bytes) -> Any:
    """JSON as a strict parser reads it: a NaN or Infinity literal is an error, not a number."""
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")
    return json.loads(raw, parse_constant=refuse)


def connect(url: str, timeout: float = 120.0) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=timeout)


def read_reply(sock: socket.socket, *, until_close: bool = True) -> Reply:
    """The server's reply. ``until_close=False``: stop once the head and its Content-Length of body are in, for a
    request whose declared body never comes (after an early 413 the server drains it for up to its lingering
    time, 10 s at the default read timeout, before it closes)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
            if not until_close and _complete(data):
                break
    except (ConnectionResetError, TimeoutError):
        pass
    head, _, body = data.partition(b"\r\n\r\n")
    first = head.split(b"\r\n", 1)[0].split()
    status = int(first[1]) if len(first) >= 2 and first[1].isdigit() else 0
    return Reply(status, head.decode("latin-1"), body)


def _complete(data: bytes) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"^content-length:\s*(\d+)\s*$", head, re.I | re.M)
    return bool(sep) and length is not None and len(body) >= int(length.group(1))


def send(url: str, data: bytes, timeout: float = 120.0, *, until_close: bool = True) -> Reply:
    """Send raw request bytes (which should ask for Connection: close) and read until the server closes (or, with
    ``until_close=False``, until the reply is complete)."""
    with connect(url, timeout) as s:
        s.sendall(data)
        return read_reply(s, until_close=until_close)


def request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None, *,
            length: int | None = None) -> bytes:
    """Request bytes; `length` overrides the Content-Length (a lie), headers may replace any default."""
    h = {"Host": "127.0.0.1", "Content-Type": "application/json", "Connection": "close",
         "Content-Length": str(len(body) if length is None else length), **(headers or {})}
    lines = "".join(f"{k}: {v}\r\n" for k, v in h.items() if v is not None)
    return f"{method} {path} HTTP/1.1\r\n{lines}\r\n".encode("latin-1") + body


def dumps_loose(obj: Any) -> bytes:
    """JSON as a careless client writes it: NaN / Infinity literals, lone surrogates as \\ud800 escapes."""
    return json.dumps(obj, allow_nan=True).encode()


# ---- strategies --------------------------------------------------------------------------------------------

any_float = st.floats(allow_nan=True, allow_infinity=True)
edge_floats = st.sampled_from([0.0, -0.0, 5e-324, 1e-308, 1e-40, 1e-5, 0.5, 1.0, 1.0 + 2 ** -52, 2.0, 1e5, 1e38,
                               1e308, -1e-40, -1.0, -1e308, math.inf, -math.inf, math.nan])
edge_ints = st.sampled_from([-(10 ** 40), -(2 ** 63) - 1, -(2 ** 63), -2, -1, 0, 1, 2, 2 ** 31, 2 ** 63,
                             2 ** 64, 10 ** 40, 10 ** 4000])
numbers = st.one_of(any_float, edge_floats, edge_ints, st.integers())
texts = st.text(alphabet=st.characters(), max_size=12)  # includes lone surrogates (category Cs)
leaf = st.one_of(st.none(), st.booleans(), numbers, texts)
values = st.recursive(leaf, lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(texts, c, max_size=3)),
                      max_leaves=6)
paths = st.one_of(st.sampled_from(["/", "/generate", "/health", "/health_generate", "/v1/loads", "/flush_cache",
                                   "/abort_request", "/update_weights_from_disk", "/get_model_info", "/nope",
                                   "/generate/../health", "//generate", "/%00", "/%ff%fe", "/generate?x=%ZZ",
                                   "/" + "a" * 9000, "/v1/loads?include=%00", "/healthz", "/get_loads",
                                   "/info", "/detect"]),
                  st.text(alphabet="abcdefghijklmnopqrstuvwxyz/_%?=&.0123456789", max_size=40).map(lambda p: "/" + p))
methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "FOO"])


def mutate(raw: bytes, data: st.DataObject) -> bytes:
    """A valid body cut, spliced or sprinkled with stray bytes."""
    how = data.draw(st.sampled_from(["cut", "insert", "flip", "repeat"]))
    if not raw:
        return raw
    i = data.draw(st.integers(0, len(raw) - 1))
    if how == "cut":
        return raw[:i]
    if how == "insert":
        return raw[:i] + data.draw(st.binary(min_size=1, max_size=8)) + raw[i:]
    if how == "flip":
        return raw[:i] + bytes([raw[i] ^ data.draw(st.integers(1, 255))]) + raw[i + 1:]
    return raw[:i] + raw[i:] * data.draw(st.integers(2, 50))
