"""Decode throughput of the embedded engine vs HF transformers `generate`, side by side in one run.

For 1, 8 and 32 concurrent requests (same model, same prompts, same number of new tokens, sampling at
T=1): the engine over HTTP (with log-probs, as RL uses it), HF generate one prompt at a time
(sequential), and HF generate on the whole left-padded batch (batched). Prints tokens/s and ratios.

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


def hf_sequential(model, prompts: list[list[int]], new_tokens: int) -> float:  # noqa: ANN001
    import torch

    start = time.perf_counter()
    for p in prompts:
        with torch.inference_mode():
            out = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 max_new_tokens=new_tokens, do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
        assert out.shape[1] == len(p) + new_tokens
    return len(prompts) * new_tokens / (time.perf_counter() - start)


def hf_batched(model, prompts: list[list[int]], new_tokens: int, pad: int) -> float:  # noqa: ANN001
    import torch

    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, longest - len(p):] = torch.tensor(p)
        mask[i, longest - len(p):] = 1
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=True, temperature=1.0,
                             top_k=0, top_p=1.0)
    assert out.shape[1] == longest + new_tokens
    return len(prompts) * new_tokens / (time.perf_counter() - start)


async def engine_run(url: str, prompts: list[list[int]], new_tokens: int) -> float:
    from slimecli.rollout.client import EngineClient

    sp = {"temperature": 1.0, "max_new_tokens": new_tokens, "ignore_eos": True}
    async with EngineClient(url) as c:
        start = time.perf_counter()
        outs = await asyncio.gather(*(c.generate(p, sampling_params=sp, return_logprob=True) for p in prompts))
        wall = time.perf_counter() - start
    assert all(len(o["output_ids"]) == new_tokens for o in outs)
    return len(prompts) * new_tokens / wall


def start_engine(model_dir: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "slimecli", "rollout", "serve", f"model.path={model_dir}",
                             f"rollout.port={port}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=ROOT, start_new_session=True)
    deadline = time.monotonic() + 300
    assert proc.stdout is not None
    for line in proc.stdout:
        if "slimecli engine ready" in line:
            return proc
        if time.monotonic() > deadline:
            break
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError("engine did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--concurrency", default="1,8,32")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from slimecli.model.tiny import create_tiny_model

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
        proc = start_engine(model_dir, port)
        url = f"http://127.0.0.1:{port}"
        try:
            asyncio.run(engine_run(url, prompts[:4], 4))  # warm-up
            hf_batched(model, prompts[:2], 2, 0)
            print(f"model: Qwen3 hidden={args.hidden} layers={args.layers} params={n_params / 1e6:.1f}M; "
                  f"prompts ~{args.prompt_len} tokens, {args.new_tokens} new tokens each, sampling T=1; "
                  f"torch threads={torch.get_num_threads()}")
            print(f"{'conc':>4} {'engine tok/s':>13} {'HF seq tok/s':>13} {'HF batch tok/s':>15} "
                  f"{'vs seq':>7} {'vs batch':>9}")
            for c in levels:
                batch = prompts[:c]
                eng = asyncio.run(engine_run(url, batch, args.new_tokens))
                seq = hf_sequential(model, batch, args.new_tokens)
                bat = hf_batched(model, batch, args.new_tokens, 0)
                print(f"{c:>4} {eng:>13.1f} {seq:>13.1f} {bat:>15.1f} {eng / seq:>6.2f}x {eng / bat:>8.2f}x",
                      flush=True)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
