"""Teacher benchmarks, each against a baseline measured side by side in the same run.

1. Memory and time of sampling (sample_n=4) + label log-probs (+ next-token log-probs) at V=151,936,
   N=2048: TP=2 sharded ops (2 gloo ranks, each holding [N, V/2]) vs a full-vocabulary materialisation
   on one rank (log_softmax over [N, V], multinomial, gather). Also the same sharded ops at TP=1, to show
   what sharding itself saves. Peak memory = peak RSS of the process minus its RSS before the logits
   existed (fresh process per variant). Goal: sharded per-rank peak <= 0.6x the full-vocab peak.
2. Tokens/s of next-token log-probs through the HTTP server (tp=1, one thread, like the baseline) vs a
   direct forward of the same model in this process (one thread). Goal: >= 0.8.

Usage: python bench/bench_teacher.py [--skip-memory] [--skip-http]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
V, N, SAMPLE_N, LABELS = 151_936, 2048, 4, 4
CHUNK = int(os.environ.get("BENCH_TEACHER_CHUNK", "4096"))  # teacher.sample_chunk_size / label_chunk_size


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def peak_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


# ---- part 1: one variant per fresh process ------------------------------------------------------------
def role(name: str) -> None:
    import torch
    import torch.distributed as dist

    from slimecli.teacher import vocab_parallel as vp

    torch.set_num_threads(1)
    tp, rank, group = 1, 0, None
    if name == "sharded":
        dist.init_process_group("gloo")
        tp, rank, group = dist.get_world_size(), dist.get_rank(), dist.group.WORLD
    gen = torch.Generator().manual_seed(0)
    labels = torch.randint(0, V, (N, LABELS), generator=gen)
    nxt = torch.randint(0, V, (N,), generator=gen)
    base = rss_kb()
    peak0 = peak_kb()
    if name == "full":
        logits = torch.randn(N, V, generator=torch.Generator().manual_seed(1))
        t0 = time.perf_counter()
        logp = torch.log_softmax(logits, dim=-1)
        label_lp, next_lp = logp.gather(-1, labels), logp.gather(-1, nxt[:, None])
        ids = torch.multinomial(logp.exp(), SAMPLE_N, replacement=True, generator=gen)
        sampled_lp = logp.gather(-1, ids)
        elapsed = time.perf_counter() - t0
        del logp, label_lp, next_lp, sampled_lp
    else:
        shard = vp.VocabShard(V, tp, rank)
        logits = torch.randn(N, shard.size, generator=torch.Generator().manual_seed(1 + rank))
        ws = vp.Workspace()
        t0 = time.perf_counter()
        stats = vp.global_stats(logits, shard, group, 1.0, CHUNK, ws)
        vp.label_log_probs(logits, labels, shard, group, 1.0, CHUNK, stats)
        vp.next_token_log_probs(logits, nxt, shard, group, 1.0, CHUNK, stats)
        vp.sample(logits, SAMPLE_N, shard, group, 1.0, CHUNK, stats, gen, ws)
        elapsed = time.perf_counter() - t0
    used_mb = (max(peak_kb(), peak0) - base) / 1024
    logits_mb = logits.numel() * 4 / 2**20
    print(json.dumps({"role": name, "rank": rank, "tp": tp, "peak_mb": used_mb, "logits_mb": logits_mb,
                      "seconds": elapsed}), flush=True)
    if name == "sharded":
        dist.destroy_process_group()


def run_role(name: str, chunk: int = 4096) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "BENCH_TEACHER_CHUNK": str(chunk)}
    me = str(Path(__file__).resolve())
    if name == "sharded":
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node",
                "2", me, "--role", name]
    else:
        argv = [sys.executable, me, "--role", name]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, check=True, cwd=ROOT).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def bench_memory() -> None:
    full = run_role("full")[0]
    tp1 = run_role("tp1ops")[0]
    sharded = run_role("sharded")
    small = max(run_role("sharded", chunk=256), key=lambda r: r["peak_mb"])
    worst = max(sharded, key=lambda r: r["peak_mb"])
    print(f"\n== sampling (n={SAMPLE_N}) + label ({LABELS}/row) + next-token log-probs, V={V}, N={N}, fp32, "
          "chunk 4096 (default) ==")
    print(f"{'variant':38s} {'peak MB/rank':>12s} {'logits MB':>10s} {'seconds':>8s}")
    print(f"{'full-vocab materialisation, 1 rank':38s} {full['peak_mb']:12.0f} {full['logits_mb']:10.0f} "
          f"{full['seconds']:8.2f}")
    print(f"{'sharded ops, TP=1 (no sharding)':38s} {tp1['peak_mb']:12.0f} {tp1['logits_mb']:10.0f} "
          f"{tp1['seconds']:8.2f}")
    for r in sorted(sharded, key=lambda r: r["rank"]):
        print(f"{'sharded ops, TP=2, rank ' + str(r['rank']):38s} {r['peak_mb']:12.0f} {r['logits_mb']:10.0f} "
              f"{r['seconds']:8.2f}")
    print(f"{'sharded ops, TP=2, chunk 256, worst rank':38s} {small['peak_mb']:12.0f} {small['logits_mb']:10.0f} "
          f"{small['seconds']:8.2f}")
    print(f"memory ratio TP=2 rank peak / full-vocab = {worst['peak_mb'] / full['peak_mb']:.2f} (goal <= 0.6; "
          f"chunk 256: {small['peak_mb'] / full['peak_mb']:.2f})")
    print(f"memory ratio TP=2 rank peak / TP=1 ops   = {worst['peak_mb'] / tp1['peak_mb']:.2f}")
    print(f"time ratio TP=2 / full-vocab             = {worst['seconds'] / full['seconds']:.2f}")


# ---- part 2: HTTP server vs direct forward --------------------------------------------------------------
def bench_http(seq_len: int = 512, n_requests: int = 8, rounds: int = 3) -> None:
    import httpx
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from slimecli.config.compose import load
    from slimecli.config.io import save_frozen
    from tests.helpers import free_port

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="bench-teacher-"))
    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(vocab_size=V, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                 tie_word_embeddings=True)).save_pretrained(str(tmp / "model"))
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, V, (seq_len,), generator=gen).tolist() for _ in range(n_requests)]

    model = AutoModelForCausalLM.from_pretrained(str(tmp / "model"), dtype=torch.float32).eval()

    @torch.no_grad()
    def direct_pass() -> float:
        """Baseline: plain forward + full log_softmax + gather, one sequence at a time."""
        model(torch.tensor([seqs[0]]))
        t0 = time.perf_counter()
        for s in seqs:
            ids = torch.tensor([s])
            torch.log_softmax(model(ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])
        return time.perf_counter() - t0

    procs, urls = [], {}
    try:
        for tp in (1, 2):  # both servers up at once; idle ranks cost nothing measurable
            port = free_port()
            cfg = load(["teacher=server", f"teacher.model_path={tmp / 'model'}", f"teacher.tp={tp}",
                        f"teacher.port={port}"])
            save_frozen(cfg, tmp / f"config-{tp}.yaml")
            argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                    "--nproc-per-node", str(tp), "-m", "slimecli.teacher", "--config", str(tmp / f"config-{tp}.yaml")]
            env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
            log = open(tmp / f"server-{tp}.log", "w")
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            urls[tp] = f"http://127.0.0.1:{port}"
        for url in urls.values():
            for _ in range(600):
                try:
                    if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.5)
        with httpx.Client(timeout=600) as client:
            def server_pass(url: str) -> float:
                client.post(url + "/generate", json={"input_ids": seqs[0]}).raise_for_status()
                t0 = time.perf_counter()
                for s in seqs:
                    client.post(url + "/generate", json={"input_ids": s}).raise_for_status()
                return time.perf_counter() - t0

            times: dict[str, list[float]] = {"direct": [], "tp1": [], "tp2": []}
            for _ in range(rounds):  # interleaved, so the machine's noise hits every variant alike
                times["direct"].append(direct_pass())
                times["tp1"].append(server_pass(urls[1]))
                times["tp2"].append(server_pass(urls[2]))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)
    best = {k: min(v) for k, v in times.items()}
    tokens = seq_len * n_requests
    print(f"\n== next-token log-probs, {n_requests} x {seq_len} tokens, Qwen3 h=128 L=4 V={V}, fp32, 1 thread/rank, "
          f"best of {rounds} interleaved rounds ==")
    print(f"direct forward (full log_softmax):  {tokens / best['direct']:8.0f} tok/s")
    print(f"HTTP teacher server tp=1:          {tokens / best['tp1']:8.0f} tok/s   ratio "
          f"{best['direct'] / best['tp1']:.2f}  (goal >= 0.8)")
    print(f"HTTP teacher server tp=2:          {tokens / best['tp2']:8.0f} tok/s   ratio "
          f"{best['direct'] / best['tp2']:.2f}  (2 ranks on 2 cores; the body runs on both)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--role", help=argparse.SUPPRESS)
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--skip-http", action="store_true")
    args = p.parse_args()
    if args.role:
        role(args.role)
        return
    if not args.skip_memory:
        bench_memory()
    if not args.skip_http:
        bench_http()


if __name__ == "__main__":
    main()
