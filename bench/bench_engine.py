"""Decode throughput of the embedded engine vs HF transformers `generate`, side by side in one run.

For 1, 8 and 32 concurrent requests (same model, same prompts, same number of new tokens, sampling at
T=1): the engine over HTTP (with log-probs, as RL uses it), HF generate one prompt at a time
(sequential; its rate does not depend on the count, so it is measured on at most 4 prompts), and HF
generate on the whole left-padded batch (batched). Prints tokens/s and ratios.

    python bench/bench_engine.py [--hidden 256 --layers 4 --new-tokens 64 --prompt-len 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab - 20) for _ in range(length + rng.randrange(-length // 4, length // 4 + 1))]
            for _ in range(n)]


@dataclass
class Rate:
    """Tokens per wall-clock second, and tokens per CPU-second (steadier on a shared, busy machine)."""

    wall: float
    cpu: float

    def best(self, other: Rate | None) -> Rate:
        return self if other is None else Rate(max(self.wall, other.wall), max(self.cpu, other.cpu))


def proc_cpu(pid: int | None = None) -> float:
    """CPU seconds (user + system, all threads) of this process or of `pid`."""
    if pid is None:
        return time.process_time()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(tokens: int, fn, pid: int | None = None) -> Rate:
    cpu0, t0 = proc_cpu(pid), time.perf_counter()
    fn()
    wall, cpu = time.perf_counter() - t0, proc_cpu(pid) - cpu0
    return Rate(tokens / wall, tokens / max(cpu, 1e-9))


def hf_sequential(model, prompts: list[list[int]], new_tokens: int) -> Rate:
    import torch

    def go() -> None:
        for p in prompts:
            with torch.inference_mode():
                out = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                     max_new_tokens=new_tokens, do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
            assert out.shape[1] == len(p) + new_tokens

    return timed(len(prompts) * new_tokens, go)


def hf_batched(model, prompts: list[list[int]], new_tokens: int, pad: int) -> Rate:
    import torch

    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, longest - len(p):] = torch.tensor(p)
        mask[i, longest - len(p):] = 1

    def go() -> None:
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=True,
                                 temperature=1.0, top_k=0, top_p=1.0)
        assert out.shape[1] == longest + new_tokens

    return timed(len(prompts) * new_tokens, go)


async def _engine_requests(url: str, prompts: list[list[int]], new_tokens: int) -> None:
    from slimecli.rollout.client import EngineClient

    sp = {"temperature": 1.0, "max_new_tokens": new_tokens, "ignore_eos": True}
    async with EngineClient(url) as c:
        outs = await asyncio.gather(*(c.generate(p, sampling_params=sp, return_logprob=True) for p in prompts))
    assert all(len(o["output_ids"]) == new_tokens for o in outs)


def engine_run(url: str, prompts: list[list[int]], new_tokens: int, pid: int) -> Rate:
    """All prompts at once over HTTP; CPU time is the engine process's."""
    return timed(len(prompts) * new_tokens, lambda: asyncio.run(_engine_requests(url, prompts, new_tokens)), pid)


def start_engine(model_dir: Path, port: int, log: Path, threads: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads)}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "slimecli", "rollout", "serve", f"model.path={model_dir}",
                                 f"rollout.port={port}"], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if "slimecli engine ready" in log.read_text():
            return proc
        time.sleep(0.2)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError(f"engine did not start:\n{log.read_text()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads on both sides (1 is steadiest on a shared machine)")
    ap.add_argument("--repeats", type=int, default=3, help="engine and HF batched runs per level (best counts)")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from slimecli.model.tiny import create_tiny_model

    torch.set_num_threads(args.threads)
    levels = [int(x) for x in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = create_tiny_model(Path(tmp) / "m", seed=0, hidden_size=args.hidden, num_layers=args.layers,
                                      num_heads=max(1, args.hidden // 32), num_kv_heads=max(1, args.hidden // 64),
                                      intermediate_size=3 * args.hidden)
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), attn_implementation="sdpa").eval()
        model.generation_config.eos_token_id = None  # both sides generate exactly new_tokens
        model.generation_config.pad_token_id = 0
        n_params = sum(p.numel() for p in model.parameters())
        prompts = make_prompts(max(levels), args.prompt_len, model.config.vocab_size)
        port = free_port()
        proc = start_engine(model_dir, port, Path(tmp) / "engine.log", args.threads)
        url = f"http://127.0.0.1:{port}"
        try:
            engine_run(url, prompts[:4], 4, proc.pid)  # warm-up
            hf_batched(model, prompts[:2], 2, 0)
            print(f"model: Qwen3 hidden={args.hidden} layers={args.layers} params={n_params / 1e6:.1f}M; "
                  f"prompts ~{args.prompt_len} tokens, {args.new_tokens} new tokens each, sampling T=1; "
                  f"torch threads={torch.get_num_threads()}; best of {args.repeats} interleaved runs")
            print("tokens per wall second (tokens per CPU-second of the generating process in brackets)")
            print(f"{'conc':>4} {'engine':>16} {'HF sequential':>16} {'HF batched':>16} {'vs seq':>15} "
                  f"{'vs batched':>15}")
            for c in levels:
                batch = prompts[:c]
                eng = bat = seq = None
                for _ in range(args.repeats):  # interleaved, best of N: the machine's load varies
                    eng = engine_run(url, batch, args.new_tokens, proc.pid).best(eng)
                    bat = hf_batched(model, batch, args.new_tokens, 0).best(bat)
                    seq = hf_sequential(model, batch[:4], args.new_tokens).best(seq)  # a rate: 1 at a time

                def cell(r: Rate) -> str:
                    return f"{r.wall:7.1f} ({r.cpu:6.1f})"

                def ratio(a: Rate, b: Rate) -> str:
                    return f"{a.wall / b.wall:5.2f}x ({a.cpu / b.cpu:5.2f}x)"

                print(f"{c:>4} {cell(eng):>16} {cell(seq):>16} {cell(bat):>16} {ratio(eng, seq):>15} "
                      f"{ratio(eng, bat):>15}", flush=True)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
