"""THUDM/slime's teacher warm-up, as its megatron server sends it (megatron_server.py, the private warm-up), against
`slimecli teacher serve` run with its defaults: `{input_ids, sample_n: 0, timeout_s}` to /generate answers 200."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from slimecli.teacher.protocol import MAX_TIMEOUT_S, RequestError, parse_generate
from tests.helpers.teacher import Server

WARMUP_TOKENS = [101, 102, 103, 104]  # slime's own
WARMUP_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("teacher"), [])
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def test_slimes_warmup_request_is_answered(teacher: Server) -> None:
    timeout = httpx.Timeout(WARMUP_TIMEOUT_S + 60, connect=10.0)
    with httpx.Client(timeout=timeout, trust_env=False) as client:
        response = client.post(f"{teacher.url}/generate", json={"input_ids": WARMUP_TOKENS, "sample_n": 0,
                                                                 "timeout_s": WARMUP_TIMEOUT_S})
    assert response.status_code == 200, response.text[:500]
    assert len(response.json()["log_probs"]) == len(WARMUP_TOKENS) - 1


@pytest.mark.parametrize("bad", [0, -1, "soon", True, float("inf"), MAX_TIMEOUT_S * 2])
def test_a_timeout_that_is_no_duration_is_400(bad: object) -> None:
    body = {"input_ids": WARMUP_TOKENS, "timeout_s": bad}
    with pytest.raises(RequestError) as exc:
        parse_generate(body, vocab_size=1000, max_length=0, default_temperature=1.0)
    assert exc.value.status == 400 and "timeout_s" in exc.value.body["error"]


def test_other_unknown_fields_are_still_400() -> None:
    with pytest.raises(RequestError, match="unsupported field"):
        parse_generate({"input_ids": WARMUP_TOKENS, "timeout": 3}, vocab_size=1000, max_length=0,
                       default_temperature=1.0)
