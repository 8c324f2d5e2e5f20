"""slime's disk weight update, driven as its SGLang engine client drives it, against `slimecli rollout serve` run
with its defaults: pause -> flush -> update_weights_from_disk -> continue, each reply checked with
raise_for_status. A refused update must not leave the engine paused (slime raises before continue_generation).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from slimecli.engine.core import roots as _roots
from slimecli.model.tiny import create_tiny_model
from slimecli.net.paths import request_dir
from slimecli.net.server import HttpError
from tests.helpers import free_port
from tests.helpers.engine import Engine, start_engine, stop_engine

PROMPT = [5, 6, 7, 8]
GREEDY = {"max_new_tokens": 3, "ignore_eos": True, "temperature": 0.0}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """`slimecli rollout serve` with no rollout.weight_roots."""
    import sys

    tmp = tmp_path_factory.mktemp("serve")
    model = create_tiny_model(tmp / "model", seed=0)
    port = free_port()
    argv = [sys.executable, "-m", "slimecli", "rollout", "serve", f"model.path={model}", f"rollout.port={port}",
            f"run.root={tmp / 'runs'}"]
    eng = start_engine(argv, port, model, tmp / "engine.log")
    try:
        yield eng
    finally:
        stop_engine(eng)


class SlimeEngineClient:
    """What slime's SGLangEngine sends (slime/backends/sglang_utils/sglang_engine.py), with the same checks."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _make_request(self, endpoint: str, payload: dict | None = None) -> dict:
        response = httpx.post(f"{self.url}/{endpoint}", json=payload or {}, timeout=60)
        response.raise_for_status()
        return response.json()

    def pause_generation(self) -> None:
        httpx.post(f"{self.url}/pause_generation", json={}, timeout=60).raise_for_status()

    def flush_cache(self) -> None:
        for _ in range(60):
            if httpx.get(f"{self.url}/flush_cache", timeout=60).status_code == 200:
                return
        raise TimeoutError("Timeout while flushing cache.")

    def update_weights_from_disk(self, model_path: str, weight_version: str) -> dict:
        return self._make_request("update_weights_from_disk", {"model_path": model_path,
                                                               "weight_version": weight_version})

    def continue_generation(self) -> None:
        httpx.post(f"{self.url}/continue_generation", json={}, timeout=60).raise_for_status()

    def reload(self, model_path: str, weight_version: str) -> None:
        """slime's _reload_rollout_weights_from_disk, for one engine."""
        self.pause_generation()
        self.flush_cache()
        self.update_weights_from_disk(model_path, weight_version)
        self.continue_generation()


def test_a_checkpoint_anywhere_on_this_host_loads_as_from_sglang(engine: Engine) -> None:
    with tempfile.TemporaryDirectory(prefix="slime-disk-weights-") as d:  # neither the run's nor the model's
        ckpt = create_tiny_model(Path(d) / "iter_0000001", seed=5)
        SlimeEngineClient(engine.url).reload(str(ckpt), "1")
    info = engine.get("/get_model_info").json()
    assert info["weight_version"] == "1"
    assert engine.get("/get_server_info").json()["paused"] is False
    engine.generate(input_ids=PROMPT, sampling_params=GREEDY)


def test_a_refused_update_leaves_generation_running(engine: Engine, tmp_path: Path) -> None:
    client = SlimeEngineClient(engine.url)
    empty = tmp_path / "no-checkpoint-here"
    empty.mkdir()
    with pytest.raises(httpx.HTTPStatusError) as exc:
        client.reload(str(empty), "2")  # raises before continue_generation, as slime's does
    reply = exc.value.response.json()
    assert reply["success"] is False and "generation continues" in reply["message"]
    assert engine.get("/get_server_info").json()["paused"] is False
    out = httpx.post(engine.url + "/generate", json={"input_ids": PROMPT, "sampling_params": GREEDY}, timeout=30)
    assert out.status_code == 200 and len(out.json()["output_ids"]) == 3


def test_clients_elsewhere_load_only_from_the_roots() -> None:
    server = SimpleNamespace(loopback_loads_anywhere=True, weight_roots=["/srv/run", "/srv/model"])
    assert _roots(server, SimpleNamespace(remote="127.0.0.1")) is None  # type: ignore[arg-type]
    assert _roots(server, SimpleNamespace(remote="::1")) is None  # type: ignore[arg-type]
    assert _roots(server, SimpleNamespace(remote="10.1.2.3")) == ["/srv/run", "/srv/model"]  # type: ignore[arg-type]
    assert _roots(server, SimpleNamespace(remote=None)) == ["/srv/run", "/srv/model"]  # type: ignore[arg-type]
    configured = SimpleNamespace(loopback_loads_anywhere=False, weight_roots=["/srv/run"])
    assert _roots(configured, SimpleNamespace(remote="127.0.0.1")) == ["/srv/run"]  # type: ignore[arg-type]


def test_the_refusal_says_how_to_allow_the_path(tmp_path: Path) -> None:
    root, other = tmp_path / "run", tmp_path / "elsewhere"
    with pytest.raises(HttpError) as exc:
        request_dir(str(other), "model_path", [root], "rollout.weight_roots")
    assert exc.value.status == 403
    assert f"rollout.weight_roots=[{root},{other}]" in exc.value.message


def test_the_default_roots_hold_the_run_and_the_served_model(tmp_path: Path, monkeypatch) -> None:
    from slimecli.config.compose import load
    from slimecli.engine.__main__ import weight_roots

    monkeypatch.delenv("SLIMECLI_RUN_DIR", raising=False)
    model = tmp_path / "model"
    model.mkdir()
    assert weight_roots(load([]), tmp_path / "run", model) == [tmp_path / "run", model]
    assert weight_roots(load([f"rollout.weight_roots=[{tmp_path}/a]"]), tmp_path / "run", model) == [f"{tmp_path}/a"]
