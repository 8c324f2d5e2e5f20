"""Hostile input against a real engine: what a careless client or an attacker sends never gets a 5xx, never
a NaN literal, never a hang; the engine stays up and a valid request succeeds afterwards.

Complements test_engine_fuzz.py (well-formed JSON with wrong fields): here the bytes themselves are hostile —
parser limits (nesting, 5000-digit integers, 1e999, NaN literals, lone surrogates, bad UTF-8), bodies that do
not match their Content-Encoding / Content-Length, oversized bodies, extreme numbers in every sampling field,
unknown paths and methods, stalled and dropped connections, a crowd over the connection cap, a 2 MB prompt.
Property-based parts are seeded and bounded (hypothesis, derandomized).
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
import zlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import wait_until
from tests.helpers.engine import Engine, engine_fixture
from tests.helpers.hostile import (
    Reply,
    connect,
    dumps_loose,
    edge_floats,
    edge_ints,
    methods,
    mutate,
    numbers,
    paths,
    read_reply,
    request,
    send,
    strict_json,
    texts,
    values,
)

READ_TIMEOUT_S = 2  # rollout.read_timeout_s of this engine: stalled heads and bodies are dropped after it
MAX_CONNECTIONS = 12
MAX_RUNNING = 2  # small, so that the body limit (context length x running requests) is a few MB
STATUS: Counter[int] = Counter()  # every status the running test saw through post_raw
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
VALID = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2, "ignore_eos": True, "temperature": 0}}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    yield from engine_fixture(tmp_path_factory.mktemp("engine"), f"rollout.read_timeout_s={READ_TIMEOUT_S}",
                              f"rollout.max_connections={MAX_CONNECTIONS}",
                              f"rollout.max_running_requests={MAX_RUNNING}")


@pytest.fixture(autouse=True)
def no_5xx_and_still_serving(engine: Engine) -> Iterator[None]:
    """After every test, on its own: no reply it got was a 5xx, and the engine still answers a valid request
    (any order of tests, any subset of them, checks the same)."""
    STATUS.clear()
    yield
    assert not [s for s in STATUS if s >= 500], STATUS
    valid_request_works(engine)


def post_raw(engine: Engine, body: bytes, path: str = "/generate", **headers: str) -> Reply:
    reply = send(engine.url, request("POST", path, body, {k.replace("_", "-"): v for k, v in headers.items()}))
    STATUS[reply.status] += 1
    return reply


def check(reply: Reply, *allowed: int) -> Any:
    """No 5xx, an allowed status, and a body a strict JSON parser accepts (errors name something)."""
    assert reply.status in allowed, (reply.status, reply.body[:500])
    data = reply.json()
    if reply.status >= 400:
        assert isinstance(data["error"]["message"], str) and data["error"]["message"]
    return data


def valid_request_works(engine: Engine) -> None:
    assert engine.proc.poll() is None, "the engine died"
    out = check(post_raw(engine, json.dumps(VALID).encode()), 200)
    assert len(out["output_ids"]) == 2
    assert httpx.get(engine.url + "/health", timeout=30).status_code == 200


# ---- parser limits -----------------------------------------------------------------------------------------

DEEP = b'{"input_ids": ' + b"[" * 5000 + b"]" * 5000 + b"}"
DEEPER = b'{"sampling_params": ' + b'{"a":' * 100000 + b"1" + b"}" * 100000 + b"}"
PARSER_CASES = {
    "nesting 5000 deep": (DEEP, "nested"),
    "nesting 100000 deep": (DEEPER, "nested"),
    "5000-digit integer": (b'{"input_ids": [' + b"7" * 5000 + b"]}", "not valid JSON"),
    "4000-digit temperature": (b'{"input_ids": [1], "sampling_params": {"temperature": ' + b"9" * 4000 + b"}}",
                               "temperature"),
    "4000-digit max_new_tokens": (b'{"input_ids": [1], "sampling_params": {"max_new_tokens": -' + b"9" * 4000
                                  + b"}}", "max_new_tokens"),
    "1e999": (b'{"input_ids": [1], "sampling_params": {"temperature": 1e999}}', "too large"),
    "NaN literal": (b'{"input_ids": [1], "sampling_params": {"temperature": NaN}}', "NaN"),
    "Infinity literal": (b'{"input_ids": [1], "sampling_params": {"top_p": -Infinity}}', "Infinity"),
    "lone surrogate in text": (b'{"text": "ab\\ud800cd"}', "text"),
    "lone surrogate in a batch text": (b'{"text": ["ok", "\\udfff"]}', "text[1]"),
    "lone surrogate in stop": (b'{"input_ids": [1], "sampling_params": {"stop": ["\\udc00"]}}',
                               "sampling_params.stop[0]"),
    "lone surrogate in rid": (b'{"input_ids": [1], "rid": "\\ud83d"}', "rid"),
    "lone surrogate in regex": (b'{"input_ids": [1], "sampling_params": {"regex": "a\\ud800"}}', "regex"),
    "lone surrogate in a key": (b'{"input_ids": [1], "\\ud800": 1}', "key"),
    "invalid UTF-8": (b'{"text": "\xff\xfe"}', "UTF-8"),
    "not an object": (b"[1, 2, 3]", "object"),
    "empty": (b"", "empty"),
    "garbage": (b"\x00\x01\x02{{{", "JSON"),
}


@pytest.mark.parametrize("name", list(PARSER_CASES))
def test_parser_limits_are_400_with_a_message(engine: Engine, name: str) -> None:
    body, words = PARSER_CASES[name]
    data = check(post_raw(engine, body), 400)
    assert words in data["error"]["message"], data


def test_a_surrogate_pair_is_text_not_an_error(engine: Engine) -> None:
    body = b'{"text": "hi \\ud83d\\ude00", "sampling_params": {"max_new_tokens": 1}}'
    check(post_raw(engine, body), 200)


# ---- bodies that do not match their headers ------------------------------------------------------------------

GOOD = json.dumps(VALID).encode()


@pytest.mark.parametrize("encoding, body, ok", [  # mtime=0: the same bytes (and test ids) in every worker
    ("gzip", b"not gzip at all", False), ("gzip", gzip.compress(GOOD, mtime=0)[:-9], False),
    ("deflate", b"\x00\x01garbage", False), ("gzip", gzip.compress(GOOD, mtime=0), True),
    ("deflate", zlib.compress(GOOD), True), ("br", b"not brotli either", False), ("x-bogus", GOOD, False),
    ("gzip, gzip", gzip.compress(gzip.compress(GOOD, mtime=0), mtime=0), None)])
def test_content_encoding_mismatch_is_4xx(engine: Engine, encoding: str, body: bytes, ok: bool | None) -> None:
    reply = post_raw(engine, body, content_encoding=encoding)
    if ok:
        check(reply, 200)
    elif ok is None:  # stacked encodings: decoded, or refused with a message
        check(reply, 200, 400, 415)
    elif "application/json" in reply.head:
        check(reply, 400, 415)
    else:  # refused by the HTTP parser itself (br without a brotli library): a plain-text 400
        assert reply.status == 400, reply
    valid_request_works(engine)


@pytest.mark.slow
def test_content_length_lies(engine: Engine) -> None:
    with connect(engine.url) as longer:  # read at the end: its read timeout runs while the others are sent
        # longer than the body, then the client stops: the body read times out (408) or the connection closes
        longer.sendall(request("POST", "/generate", GOOD, length=len(GOOD) + 50))
        # shorter than the body: the rest is read as the next request, which is not one
        reply = send(engine.url, request("POST", "/generate", GOOD + b"garbage\r\n\r\n", length=len(GOOD),
                                         headers={"Connection": "keep-alive"}), until_close=False)
        assert reply.status in (200, 400), reply  # the answer, or the parser's refusal of what follows it
        for bad in ("-1", "abc", "1e3", "99999999999999999999999999"):
            reply = send(engine.url, request("POST", "/generate", GOOD, headers={"Content-Length": bad}))
            assert 400 <= reply.status < 500 or reply.status == 0, (bad, reply)
        reply = read_reply(longer, until_close=False)
    assert reply.status in (0, 408), reply
    if reply.status:
        check(reply, 408)
    valid_request_works(engine)


@pytest.mark.slow
def test_bodies_over_the_limit_are_413(engine: Engine) -> None:
    limit = 65536 * MAX_RUNNING * 16 + (1 << 20)  # context length x running requests x bytes a token takes
    data = check(send(engine.url, request("POST", "/generate", b"", length=10 ** 10), until_close=False), 413)
    assert str(limit) in data["error"]["message"]
    big = b'{"text": "' + b"a" * (limit + 10) + b'"}'
    check(post_raw(engine, big), 413)
    # the same without a Content-Length (chunked): refused as soon as the limit is passed
    chunks = [big[i:i + 65536] for i in range(0, len(big), 65536)]
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    reply = send(engine.url, request("POST", "/generate", chunked, {"Content-Length": None,
                                                                    "Transfer-Encoding": "chunked"}))
    assert reply.status in (0, 413), reply
    bomb = gzip.compress(b'{"text": "' + b" " * (limit * 3) + b'"}')  # small on the wire, large decoded
    assert len(bomb) < limit // 10
    check(post_raw(engine, bomb, content_encoding="gzip"), 413)
    valid_request_works(engine)


# ---- numbers -----------------------------------------------------------------------------------------------

EDGES = [("temperature", 1e-40, 200), ("temperature", 5e-324, 200), ("temperature", 0, 200),
         ("temperature", 1e308, 200), ("temperature", -1e-40, 400), ("temperature", 10 ** 400, 400),
         ("top_p", 1e-300, 200), ("top_p", 1, 200), ("top_p", 1 + 2 ** -52, 400), ("top_p", 0, 400),
         ("top_k", 1, 200), ("top_k", 10 ** 30, 200), ("top_k", -1, 200), ("top_k", 0, 400), ("top_k", -2, 400),
         ("min_p", 0, 200), ("min_p", 1, 200), ("min_p", 1.0000001, 400), ("min_p", -1e-300, 400),
         ("repetition_penalty", 1e-6, 200), ("repetition_penalty", 2, 200), ("repetition_penalty", 1e-300, 400),
         ("repetition_penalty", 2.0000001, 400), ("frequency_penalty", -2, 200), ("frequency_penalty", 2.5, 400),
         ("presence_penalty", 2, 200), ("presence_penalty", -2.0000001, 400), ("max_new_tokens", 0, 200),
         ("max_new_tokens", 10 ** 30, 200), ("max_new_tokens", -1, 400), ("min_new_tokens", 10 ** 30, 400),
         ("sampling_seed", 2 ** 64 - 1, 200), ("sampling_seed", -(2 ** 63), 200), ("sampling_seed", 2 ** 64, 400),
         ("n", 256, 200), ("n", 257, 400), ("stream_interval", 10 ** 30, 200)]


@pytest.mark.parametrize("field, value, status", EDGES)
def test_numeric_edges(engine: Engine, field: str, value: Any, status: int) -> None:
    sp: dict[str, Any] = {field: value, "max_new_tokens": 2, "ignore_eos": True}
    if field == "max_new_tokens":  # clipped to the context window; every token stops it at once
        vocab = httpx.get(engine.url + "/get_server_info", timeout=30).json()["vocab_size"]
        sp = {field: value, "stop_token_ids": list(range(vocab)), "min_new_tokens": 0}
    if field == "n":
        sp["max_new_tokens"] = 1
    if field in ("repetition_penalty", "frequency_penalty", "presence_penalty", "min_p", "top_p", "top_k"):
        sp["temperature"] = 0.7
    body = {"input_ids": [5, 6, 7, 5, 6], "sampling_params": sp, "return_logprob": True, "top_logprobs_num": 3}
    data = check(post_raw(engine, json.dumps(body).encode()), status)
    if status == 400:
        assert field in data["error"]["message"]


@SETTINGS
@given(sp=st.dictionaries(st.sampled_from(["temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                                           "frequency_penalty", "presence_penalty", "max_new_tokens",
                                           "min_new_tokens", "sampling_seed", "n", "stream_interval"]),
                          st.one_of(numbers, edge_floats, edge_ints), max_size=4),
       top=st.one_of(st.none(), numbers), start=st.one_of(st.none(), numbers))
def test_random_numbers_never_5xx_nor_nan(engine: Engine, sp: dict[str, Any], top: Any, start: Any) -> None:
    sp = {**sp, "max_new_tokens": 2} if "max_new_tokens" not in sp else sp
    if isinstance(sp.get("n"), int) and not isinstance(sp["n"], bool) and sp["n"] > 4:
        sp["n"] = 4
    body = {"input_ids": [5, 6, 7], "sampling_params": sp, "return_logprob": True, "top_logprobs_num": top,
            "logprob_start_len": start, "token_ids_logprob": [1, 2]}
    check(post_raw(engine, dumps_loose(body)), 200, 400)


@SETTINGS
@given(body=st.one_of(values, st.dictionaries(st.sampled_from(["text", "input_ids", "sampling_params", "rid",
                                                                "stream", "return_logprob"]), values, max_size=4)))
def test_random_values_never_5xx(engine: Engine, body: Any) -> None:
    check(post_raw(engine, dumps_loose(body)), 200, 400)


@SETTINGS
@given(data=st.data())
def test_mutated_bodies_never_5xx(engine: Engine, data: st.DataObject) -> None:
    raw = mutate(GOOD, data)
    check(post_raw(engine, raw), 200, 400)


@SETTINGS
@given(text=texts)
def test_any_text_is_generated_from_or_refused(engine: Engine, text: str) -> None:
    body = {"text": text, "sampling_params": {"max_new_tokens": 1, "stop": [text or "x"]}}
    check(post_raw(engine, json.dumps(body).encode()), 200, 400)


# ---- paths and methods -------------------------------------------------------------------------------------


@SETTINGS
@given(method=methods, path=paths, body=st.one_of(st.just(b""), st.just(GOOD), st.binary(max_size=20)))
def test_any_path_and_method_is_answered_below_500(engine: Engine, method: str, path: str, body: bytes) -> None:
    reply = send(engine.url, request(method, path, body))
    STATUS[reply.status] += 1
    assert 0 < reply.status < 500, (method, path, reply)
    if method != "HEAD" and reply.body and reply.status >= 400 and b"{" in reply.body[:1]:
        reply.json()


def test_malformed_request_heads(engine: Engine) -> None:
    heads = [b"GARBAGE\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"GET /health HTTP/1.1\r\n" + b"X: y\r\n" * 500
             + b"\r\n", b"GET /health HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n",
             b"POST /generate HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
             b"POST /generate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nxx\r\n0\r\n\r\n",
             b"GET /health\xff\xfe HTTP/1.1\r\n\r\n"]
    for head in heads:
        reply = send(engine.url, head)
        assert reply.status == 0 or 400 <= reply.status < 500, (head[:60], reply)
    valid_request_works(engine)


# ---- slow, stalled and dropped clients ---------------------------------------------------------------------


@pytest.mark.slow
def test_stalled_head_and_body_are_dropped(engine: Engine) -> None:
    # the three stall side by side: each connection's read timeout runs on its own
    with connect(engine.url) as head, connect(engine.url) as body, connect(engine.url) as idle:
        head.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Le")  # a head that never ends
        body.sendall(request("POST", "/generate", b'{"input_ids"', length=200, headers={"Connection": None}))
        assert read_reply(head).status == 0  # closed, nothing answered
        reply = read_reply(body, until_close=False)  # a body that never comes: 408 naming the timeout (then drained)
        assert read_reply(idle).status == 0  # nothing at all: closed
    assert check(reply, 408)["error"]["message"].startswith("body")
    valid_request_works(engine)


def test_dropped_clients(engine: Engine) -> None:
    for data in (request("POST", "/generate", GOOD)[:-5], request("POST", "/generate", GOOD),
                 request("POST", "/generate", json.dumps({**VALID, "stream": True}).encode()),
                 request("POST", "/generate", json.dumps({"input_ids": [5], "sampling_params": {
                     "max_new_tokens": 500, "ignore_eos": True}}).encode())):
        s = connect(engine.url)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
        s.sendall(data)
        s.close()
    valid_request_works(engine)


def test_connections_over_the_cap_get_503_and_the_engine_recovers(engine: Engine) -> None:
    long = json.dumps({"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 60000, "ignore_eos": True}})
    held = []
    try:
        for _ in range(MAX_CONNECTIONS):
            s = connect(engine.url)
            s.sendall(request("POST", "/generate", long.encode()))  # long generations: the connections stay busy
            held.append(s)
        replies = [send(engine.url, request("GET", "/health")) for _ in range(3)]  # the refusal is by design:
        assert any(r.status == 503 for r in replies), replies                      # not counted as a 5xx
        refused = next(r for r in replies if r.status == 503)
        assert "too many open connections" in refused.json()["error"]["message"]
    finally:
        for s in held:
            s.close()  # the engine aborts their generations
    wait_until(lambda: send(engine.url, request("GET", "/health")).status == 200, 120, "the connections to close")
    valid_request_works(engine)


def test_a_2mb_prompt_does_not_stop_health(engine: Engine) -> None:
    result: dict[str, Reply] = {}

    def big() -> None:
        result["big"] = post_raw(engine, json.dumps({"text": "word " * 400_000}).encode())

    t = threading.Thread(target=big)
    t.start()
    health = []
    while t.is_alive() and len(health) < 50:
        health.append(httpx.get(engine.url + "/health", timeout=60).status_code)
    t.join(300)
    assert set(health) <= {200}
    data = check(result["big"], 400, 413)
    assert "context" in data["error"]["message"] or "limit" in data["error"]["message"]
    valid_request_works(engine)


def test_replies_never_carry_nan(engine: Engine) -> None:
    """Log-probs of tokens no sampler would pick (token_ids_logprob at an extreme temperature) stay JSON."""
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3, "temperature": 1e-5, "top_k": 1,
                                                         "logit_bias": {"1": -1e30, "2": 1e30}},
            "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 5, "token_ids_logprob": [1, 2, 3]}
    for stream in (False, True):
        reply = post_raw(engine, json.dumps({**body, "stream": stream}).encode())
        assert reply.status == 200, reply
        text = reply.body.decode()
        assert "NaN" not in text and "Infinity" not in text
        if not stream:
            strict_json(reply.body)
        else:
            for line in text.split("\n"):
                if line.startswith("data: {"):
                    strict_json(line[6:].encode())
