"""The first run on a GPU machine: the GPU paths that CPU CI cannot reach, each as a user starts it.

1. `slimecli train` (the quickstart) for a few steps with trainer=torch and trainer=megatron, float32 and
   bfloat16 (megatron-core's mixed-precision optimizer runs only on a GPU), trainer ranks on nccl and the
   embedded engine on the GPU;
2. `slimecli teacher serve` with teacher.backend=torch and teacher.backend=megatron, scored over HTTP.

Prints, per case, tokens/s and the peak GPU memory (nvidia-smi, sampled every 100 ms: every process of the
case together), and fails loudly (exit 1, the log's tail) on the first case that does not work. With two or
more GPUs it adds trainer=megatron at TP=2 and teacher.tp=2. Run it through bench/gpu_check.sh (set-up
included) or, in an environment that has slimecli and megatron-core, directly:

    python bench/gpu_check.py [--steps 6] [--model-path DIR] [--only train|teacher] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class GpuMemory:
    """Peak memory.used over every GPU while the block runs (MiB), from nvidia-smi's own sampling loop."""

    def __enter__(self) -> GpuMemory:
        self.peak = 0
        self._proc = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                       "-lms", "100"], stdout=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            values = [int(v) for v in line.split(",") if v.strip().isdigit()]
            if values:
                self.peak = max(self.peak, max(values))

    def __exit__(self, *exc: object) -> None:
        self._proc.terminate()
        self._proc.wait(10)


def fail(what: str, log: Path | None = None) -> None:
    tail = log.read_text(errors="replace")[-6000:] if log and log.exists() else ""
    print(f"\nGPU CHECK FAILED: {what}\n{tail}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def slimecli(*args: str) -> list[str]:
    return [sys.executable, "-m", "slimecli", *args]


def train_case(tmp: Path, name: str, overrides: list[str], steps: int, model_path: str | None) -> dict:
    run_dir = tmp / name
    log = tmp / f"{name}.log"
    argv = slimecli("train", f"run.dir={run_dir}", f"trainer.max_steps={steps}", "rollout.device=cuda", *([f"model.path={model_path}"] if model_path else []), *overrides)
    started = time.perf_counter()
    with GpuMemory() as mem, open(log, "w") as out:
        proc = subprocess.run(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=900)
    if proc.returncode != 0:
        fail(f"train {name} exited {proc.returncode}: {' '.join(argv[2:])}", log)
    rows = [row for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if line.strip() and (row := json.loads(line))["step"]]  # row 0: the evaluation at start
    if len(rows) != steps:
        fail(f"train {name}: {len(rows)} metrics rows for {steps} steps", log)
    steady = rows[1:] or rows  # the first step pays for warm-up
    return {"case": f"train {name}", "tokens_per_s": statistics.fmean(r["perf/tokens_per_s"] for r in steady),
            "step_s": statistics.fmean(r["time/step_s"] for r in steady), "peak_mib": mem.peak,
            "reward": rows[-1].get("reward/mean"), "wall_s": time.perf_counter() - started}


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float = 600.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            fail(f"teacher exited {proc.returncode} before it was ready", log)
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    fail(f"teacher not ready after {timeout:.0f}s", log)


def teacher_case(tmp: Path, name: str, overrides: list[str], model_path: str, requests: int, length: int) -> dict:
    import httpx

    from slimecli.net.ports import free_port
    from slimecli.process import kill_group

    port = free_port()
    log = tmp / f"teacher-{name}.log"
    argv = slimecli("teacher", "serve", f"teacher.model_path={model_path}", f"teacher.port={port}",
                    f"run.dir={tmp / ('teacher-' + name)}", *overrides)
    url = f"http://127.0.0.1:{port}"
    with GpuMemory() as mem, open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_healthy(url, proc, log)
            vocab = httpx.get(url + "/info", timeout=30).json()["vocab_size"]
            ids = [(7 * i + 3) % vocab for i in range(length)]
            body = {"input_ids": ids, "sample_n": 4, "label_token_ids": [[t] for t in ids[1:]]}
            started = time.perf_counter()
            for _ in range(requests):
                r = httpx.post(url + "/generate", json=body, timeout=600)
                if r.status_code != 200:
                    fail(f"teacher {name}: HTTP {r.status_code} {r.text[:500]}", log)
            elapsed = time.perf_counter() - started
        finally:
            kill_group(proc.pid, grace_s=20, leader=proc)
    return {"case": f"teacher {name}", "tokens_per_s": requests * length / elapsed, "step_s": elapsed / requests,
            "peak_mib": mem.peak, "reward": None, "wall_s": elapsed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--model-path", help="an HF checkpoint (default: the tiny model slimecli creates)")
    parser.add_argument("--only", choices=["train", "teacher"])
    parser.add_argument("--teacher-requests", type=int, default=20)
    parser.add_argument("--teacher-length", type=int, default=1024)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        fail("torch sees no GPU (torch.cuda.is_available() is False): install a CUDA build of PyTorch")
    if shutil.which("nvidia-smi") is None:
        fail("nvidia-smi is not on PATH")
    gpus = torch.cuda.device_count()
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {gpus} x {torch.cuda.get_device_name(0)}",
          flush=True)
    trains = {"torch-fp32": ["trainer=torch", "trainer.nproc=1"],
              "torch-bf16": ["trainer=torch", "trainer.nproc=1", "model.dtype=bfloat16"],
              "megatron-fp32": ["trainer=megatron", "trainer.nproc=1"],
              "megatron-bf16": ["trainer=megatron", "trainer.nproc=1", "model.dtype=bfloat16"]}
    teachers = {"torch": ["teacher.backend=torch"], "megatron": ["teacher.backend=megatron"]}
    if gpus >= 2:
        trains["megatron-tp2"] = ["trainer=megatron", "trainer.nproc=2", "trainer.tensor_parallel_size=2"]
        teachers["megatron-tp2"] = ["teacher.backend=megatron", "teacher.tp=2"]
    results = []
    with tempfile.TemporaryDirectory(prefix="slimecli-gpu-check-") as name:
        tmp = Path(name)
        model_path = args.model_path
        if model_path is None:
            subprocess.run(slimecli("model", "init", str(tmp / "tiny")), cwd=ROOT, check=True)
            model_path = str(tmp / "tiny")
        for case, overrides in trains.items() if args.only in (None, "train") else []:
            print(f"train {case} ...", flush=True)
            results.append(train_case(tmp, case, overrides, args.steps, model_path))
        for case, overrides in teachers.items() if args.only in (None, "teacher") else []:
            print(f"teacher {case} ...", flush=True)
            results.append(teacher_case(tmp, case, overrides, model_path, args.teacher_requests,
                                        args.teacher_length))
    print(f"\n{'case':<24}{'tokens/s':>12}{'s/step|req':>12}{'peak GPU MiB':>14}{'reward':>8}")
    for r in results:
        reward = f"{r['reward']:.2f}" if isinstance(r["reward"], int | float) else "-"
        print(f"{r['case']:<24}{r['tokens_per_s']:>12.1f}{r['step_s']:>12.3f}{r['peak_mib']:>14d}{reward:>8}")
    print("\nGPU CHECK PASSED", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
