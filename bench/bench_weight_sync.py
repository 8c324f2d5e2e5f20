"""Weight-sync time per step: trainer.weight_sync=disk against shared_memory (and nccl's protocol), side by side.

For each model size (about 4M and 50M parameters, the tiny architecture made wider and deeper) this starts
a real embedded engine (`slimecli rollout serve`) and pushes rank 0's model to it the way the trainer
does after every step — the same WeightSync objects, before_update before the (simulated, in-place)
optimizer step, pause -> update -> continue — with the kinds interleaved so each sees the same machine
load. Every push changes the weights, and the engine's weight_version is checked after it. shared_memory
keeps one copy of the weights for trainer and engine (a CPU model in the engine's dtype), as in training. Prints the median seconds per push and the ratio to disk
(goal: shared_memory <= 0.3 x disk at both sizes). On a CPU the nccl kind runs its protocol over gloo.

    python bench/bench_weight_sync.py [--reps 5] [--sizes 4m,50m]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from slimecli.config.compose import load  # noqa: E402
from slimecli.model.tiny import create_tiny_model  # noqa: E402
from slimecli.rollout.client import EngineClient  # noqa: E402
from slimecli.train.weight_sync import make_weight_sync  # noqa: E402

SIZES = {  # name -> the tiny architecture's shape
    "4m": {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 1024},
    "50m": {"hidden_size": 768, "num_layers": 8, "num_heads": 12, "num_kv_heads": 4, "intermediate_size": 2048},
}
KINDS = ("disk", "shared_memory", "shared_memory_copy", "nccl")  # _copy: a model the segment cannot hold


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_engine(model: Path, port: int, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "slimecli", "rollout", "serve", f"model.path={model}", f"rollout.port={port}"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    deadline = time.monotonic() + 300
    while "slimecli engine ready" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"engine did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.2)
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def bench_size(name: str, reps: int, tmp: Path) -> dict[str, float]:
    model = create_tiny_model(tmp / name, seed=0, **SIZES[name])
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model))
    params = sum(p.numel() for p in hf.parameters())  # a tied weight once
    port = free_port()
    proc = start_engine(model, port, tmp / f"{name}.log")
    loop = asyncio.new_event_loop()
    engines = [EngineClient(f"http://127.0.0.1:{port}")]
    run: Any = loop.run_until_complete
    # rank 0's model goes with the state, as in training (shared_memory may keep it in the segment)
    # (shared_memory_copy: the same without the model, as for an FSDP or GPU trainer: one copy per push)
    syncs = {k: make_weight_sync(load([f"model.path={model}", f"trainer.weight_sync={k.removesuffix('_copy')}"]),
                                 tmp / name / "run", engines, run, policy=None if k.endswith("_copy") else hf)
             for k in KINDS}
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    try:
        version = 0
        for rep in range(reps + 1):  # the first round warms up (the nccl kind joins its group there)
            for kind in KINDS:
                version += 1
                start = time.perf_counter()
                syncs[kind].before_update()  # as the trainer does before its optimizer step
                paused = time.perf_counter() - start
                with torch.no_grad():  # the optimizer step: new values in place
                    for p in hf.parameters():
                        p.add_(1e-3)
                start = time.perf_counter()
                syncs[kind].push(dict(hf.state_dict()), version)
                elapsed = paused + time.perf_counter() - start
                info = run(engines[0].get_model_info())
                assert info["weight_version"] == str(version), info
                if rep:
                    times[kind].append(elapsed)
    finally:
        for sync in syncs.values():
            sync.close()
        run(engines[0].close())
        loop.close()
        stop(proc)
    medians = {k: statistics.median(v) for k, v in times.items()}
    print(f"{name}: {params / 1e6:.1f}M parameters ({params * 4 / 2**20:.0f} MiB in float32), {reps} pushes per kind")
    for kind in KINDS:
        print(f"  {kind:<19} {medians[kind] * 1000:8.1f} ms   {medians[kind] / medians['disk']:.2f}x disk")
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--sizes", default="4m,50m")
    args = parser.parse_args()
    torch.set_num_threads(1)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.sizes.split(","):
            medians = bench_size(name, args.reps, Path(tmp))
            ratio = medians["shared_memory"] / medians["disk"]
            ok &= ratio <= 0.3
            print(f"  shared_memory / disk = {ratio:.2f} (goal <= 0.3): {'met' if ratio <= 0.3 else 'NOT met'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
