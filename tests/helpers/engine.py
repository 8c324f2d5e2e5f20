"""Helpers for the engine tests: a real engine process on a free loopback port, and the same model in-process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch

from slimecli.model.tiny import create_tiny_model
from slimecli.process import kill_group
from tests.helpers import ROOT, free_port


@dataclass
class Engine:
    url: str
    proc: subprocess.Popen
    model_path: Path
    log: Path

    def post(self, path: str, body: object = None, **kw: object) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=120, **kw)

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, timeout=60)

    def generate(self, **body: object) -> object:
        resp = self.post("/generate", body)
        assert resp.status_code == 200, resp.text
        return resp.json()


def start_engine(argv: list[str], port: int, model_path: Path, log: Path, timeout: float = 180) -> Engine:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                start_new_session=True)
    eng = Engine(f"http://127.0.0.1:{port}", proc, model_path, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"engine exited with {proc.returncode}:\n{log.read_text()}")
        if "slimecli engine ready" in log.read_text():
            return eng
        time.sleep(0.2)
    stop_engine(eng)
    raise RuntimeError(f"engine not ready in {timeout}s:\n{log.read_text()}")


def stop_engine(eng: Engine) -> None:
    if eng.proc.poll() is None:
        kill_group(eng.proc.pid, grace_s=20, leader=eng.proc)
        eng.proc.wait(timeout=10)


def engine_fixture(tmp: Path, *extra: str) -> Iterator[Engine]:
    model = create_tiny_model(tmp / "model", seed=0)
    port = free_port()
    argv = [sys.executable, "-m", "slimecli", "rollout", "serve", f"model.path={model}", f"rollout.port={port}",
            f"run.root={tmp / 'runs'}", f"rollout.weight_roots=[{tmp.parent}]", *extra]
    eng = start_engine(argv, port, model, tmp / "engine.log")
    try:
        yield eng
    finally:
        stop_engine(eng)
        assert eng.proc.returncode is not None


def hf_logprobs(model: torch.nn.Module, prompt: list[int], output: list[int], temperature: float) -> list[float]:
    """log_softmax(logits / T) of each output token, teacher-forced, over the full vocabulary."""
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    lp = torch.log_softmax(logits / temperature, dim=-1)
    return lp.gather(1, torch.tensor(output).unsqueeze(1)).squeeze(1).tolist()
