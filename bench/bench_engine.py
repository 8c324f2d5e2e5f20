"""Decode throughput of the embedded engine vs HF transformers `generate`, side by side in one run.

For 1, 8 and 32 concurrent requests (same model, same prompts, same number of new tokens, sampling at
T=1): the engine over HTTP (with log-probs, as RL uses it), HF generate one prompt at a time
(sequential; its rate does not depend on the count, so it is measured on at most 4 prompts), and HF
generate on the whole left-padded batch (batched). Prints tokens/s and ratios.

--bound adds the engine's bound: a bare greedy loop in this process (the same model and left-padded batch, one
forward and an argmax per token, keys/values appended in place; no HTTP, no scheduler, no sampler), beside the
engine at greedy without log-probs, like with like. Both include the prompt's prefill. Beside them, the same loop on
the engine's own implementation of the model (model/plain_decoder.py, without transformers' Python around each
layer), its decode steps through the `step` the engine calls: the model's own speed on this machine, with nothing
of an engine around it. Its ratio over HF's batched generate is about the most an engine on these kernels can
reach; the bench prints what the goal of 1.5x HF batched asks of it.

--baseline-ref [GITREF] adds the engine of another commit (default: the commit the decode-loop rework started
from), exported with `git archive` into a temporary directory and served from there by this interpreter; both
engines run the same requests, interleaved, and the ratio is this checkout's over the baseline's (at T=1 with
log-probs, and at greedy too with --bound).

Every figure is the best of --repeats interleaved runs, in tokens per wall second and, in brackets, tokens per
CPU-second of the process that generates (steadier on a shared, busy machine).

    python bench/bench_engine.py [--bound] [--baseline-ref[=GITREF]] [--hidden 256 --layers 4 --new-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

DEFAULT_REF = "d3b0cd85753aaa0882368adf5f44b363cd2fe1c5"  # the last commit before the decode-loop rework


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

    def cell(self) -> str:
        return f"{self.wall:7.1f} ({self.cpu:6.1f})"

    def over(self, other: Rate) -> str:
        return f"{self.wall / other.wall:5.2f}x ({self.cpu / other.cpu:5.2f}x)"


def proc_cpu(pid: int | None = None) -> float:
    """CPU seconds (user + system, all threads) of this process or of `pid`."""
    if pid is None:
        return time.process_time()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(tokens: int, fn: Callable[[], object], pid: int | None = None) -> Rate:
    cpu0, t0 = proc_cpu(pid), time.perf_counter()
    fn()
    wall, cpu = time.perf_counter() - t0, proc_cpu(pid) - cpu0
    return Rate(tokens / wall, tokens / max(cpu, 1e-9))


def left_padded(prompts: list[list[int]], pad: int) -> tuple[Any, Any]:
    import torch

    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, longest - len(p):] = torch.tensor(p)
        mask[i, longest - len(p):] = 1
    return ids, mask


def hf_sequential(model: Any, prompts: list[list[int]], new_tokens: int) -> Rate:
    import torch

    def go() -> None:
        for p in prompts:
            with torch.inference_mode():
                out = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                     max_new_tokens=new_tokens, do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
            assert out.shape[1] == len(p) + new_tokens

    return timed(len(prompts) * new_tokens, go)


def hf_batched(model: Any, prompts: list[list[int]], new_tokens: int, pad: int) -> Rate:
    import torch

    ids, mask = left_padded(prompts, pad)

    def go() -> None:
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=True,
                                 temperature=1.0, top_k=0, top_p=1.0)
        assert out.shape[1] == ids.shape[1] + new_tokens

    return timed(len(prompts) * new_tokens, go)


def bare_greedy(model: Any, prompts: list[list[int]], new_tokens: int, pad: int, *, own_step: bool = False) -> Rate:
    """The bound: prefill the left-padded batch, then one forward and one argmax per token for the whole batch,
    keys/values appended in place (the engine's cache layer, so that a concatenating cache does not slow it).
    ``own_step``: the model is the engine's own (model/plain_decoder.py), its decode steps through the same `step` the
    engine calls (no mask without padding): the model's own speed, with nothing of an engine around it."""
    import torch

    from slimecli.engine.kvcache import BatchCache

    ids, mask = left_padded(prompts, pad)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    pads = [int(n) for n in (mask == 0).sum(-1)]
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def go() -> None:
        cache = BatchCache(model.config.num_hidden_layers)
        m, p = mask, pos
        with torch.inference_mode():
            out = model(input_ids=ids, attention_mask=m, position_ids=p, use_cache=True, logits_to_keep=1,
                        **{kw: cache})
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            p = p[:, -1:]
            for _ in range(new_tokens - 1):
                p = p + 1
                if own_step:
                    tok = model.step(tok, p, pads, cache).argmax(-1, keepdim=True)
                    continue
                m = torch.cat([m, m.new_ones(len(prompts), 1)], 1)
                out = model(input_ids=tok, attention_mask=m, position_ids=p, use_cache=True, **{kw: cache})
                tok = out.logits[:, -1].argmax(-1, keepdim=True)

    return timed(len(prompts) * new_tokens, go)


class Engine:
    """`slimecli rollout serve` of one checkout (this one, or a baseline export) on a free port."""

    def __init__(self, checkout: Path, model_dir: Path, log: Path, threads: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(checkout), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads)}
        with open(log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "slimecli", "rollout", "serve",
                                          f"model.path={model_dir}", f"rollout.port={self.port}"],
                                         stdout=out, stderr=subprocess.STDOUT, env=env, cwd=checkout,
                                         start_new_session=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and self.proc.poll() is None:
            if "slimecli engine ready" in log.read_text():
                return
            time.sleep(0.2)
        self.stop(signal.SIGKILL)
        raise RuntimeError(f"engine from {checkout} did not start:\n{log.read_text()}")

    def run(self, prompts: list[list[int]], new_tokens: int, greedy: bool = False, logprobs: bool = True) -> Rate:
        """All prompts at once over HTTP; CPU time is the engine process's."""
        sp = {"temperature": 0.0 if greedy else 1.0, "max_new_tokens": new_tokens, "ignore_eos": True}

        async def go() -> None:
            from slimecli.rollout.client import EngineClient

            async with EngineClient(self.url) as c:
                outs = await asyncio.gather(*(c.generate(p, sampling_params=sp, return_logprob=logprobs)
                                              for p in prompts))
            assert all(len(o["output_ids"]) == new_tokens for o in outs)

        return timed(len(prompts) * new_tokens, lambda: asyncio.run(go()), self.proc.pid)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
        self.proc.wait(timeout=30)



def measure(engines: dict[str, Engine], model: Any, batch: list[list[int]], new_tokens: int, repeats: int,
            own: Any) -> dict[str, Rate]:
    """Every side's best rate over `repeats` interleaved rounds (the machine's load varies; each round hits all)."""
    best: dict[str, Rate] = {}
    bound = own is not None

    def note(key: str, rate: Rate) -> None:
        best[key] = rate.best(best.get(key))

    for _ in range(repeats):
        for side, e in engines.items():
            note(side, e.run(batch, new_tokens))
            if bound:
                note(f"{side} greedy", e.run(batch, new_tokens, greedy=True, logprobs=False))
        note("batched", hf_batched(model, batch, new_tokens, 0))
        note("sequential", hf_sequential(model, batch[:4], new_tokens))  # a rate: 1 at a time
        if bound:
            note("bare", bare_greedy(model, batch, new_tokens, 0))
            note("own", bare_greedy(own, batch, new_tokens, 0, own_step=True))
    return best


def baseline_checkout(ref: str, dest: Path) -> tuple[Path, str]:
    """GITREF exported into dest (the repository and its work tree untouched), and a line that says what it is."""
    from bench_train_step import check_imports, export_ref, git

    commit = git("rev-parse", "--verify", "--end-of-options", f"{ref}^{{commit}}")
    tree = export_ref(commit, dest)
    check_imports(tree)
    return tree, f"{ref[:10] if ref == commit else ref} = {commit[:10]} {git('log', '-1', '--format=%s', commit)[:70]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads on every side (1 is steadiest on a shared machine)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved runs per level and side (best counts)")
    ap.add_argument("--bound", action="store_true", help="add the bare greedy loop and the engine at greedy")
    ap.add_argument("--baseline-ref", nargs="?", const=DEFAULT_REF, default=None, metavar="GITREF",
                    help=f"add the engine of GITREF, side by side (default: {DEFAULT_REF[:10]})")
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
        engines: dict[str, Engine] = {}
        try:
            engines["current"] = Engine(ROOT, model_dir, Path(tmp) / "engine.log", args.threads)
            if args.baseline_ref is not None:
                tree, described = baseline_checkout(args.baseline_ref, Path(tmp) / "baseline-src")
                engines["baseline"] = Engine(tree, model_dir, Path(tmp) / "baseline.log", args.threads)
            for e in engines.values():  # warm-up
                e.run(prompts[:4], 4)
                e.run(prompts[:4], 4, greedy=True, logprobs=False)
            hf_batched(model, prompts[:2], 2, 0)
            bare_greedy(model, prompts[:2], 2, 0)
            own = None
            if args.bound:  # the engine's own implementation of the same checkpoint
                from slimecli.model.plain_decoder import plain_decoder_or_why

                own, why = plain_decoder_or_why(model_dir, torch.float32)
                if own is None:
                    raise SystemExit(f"the engine's own model does not load this checkpoint: {why}")
                bare_greedy(own, prompts[:2], 2, 0, own_step=True)
            print(f"model: Qwen3 hidden={args.hidden} layers={args.layers} params={n_params / 1e6:.1f}M; "
                  f"prompts ~{args.prompt_len} tokens, {args.new_tokens} new tokens each; "
                  f"torch threads={torch.get_num_threads()}; best of {args.repeats} interleaved runs; "
                  f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
            if args.baseline_ref is not None:
                print(f"baseline: {described}")
            print("tokens per wall second (tokens per CPU-second of the generating process in brackets)")
            tables: dict[str, list[str]] = {"main": [], "bound": [], "baseline": []}
            for c in levels:
                batch = prompts[:c]
                r = measure(engines, model, batch, args.new_tokens, args.repeats, own)
                eng = r["current"]
                tables["main"].append(f"{c:>4} {eng.cell():>16} {r['sequential'].cell():>16} "
                                      f"{r['batched'].cell():>16} {eng.over(r['sequential']):>15} "
                                      f"{eng.over(r['batched']):>15}")
                if args.bound:
                    own_x = r["own"].wall / r["batched"].wall
                    tables["bound"].append(f"{c:>4} {r['current greedy'].cell():>16} {r['bare'].cell():>16} "
                                           f"{r['current greedy'].over(r['bare']):>15} {r['own'].cell():>16} "
                                           f"{own_x:>9.2f}x {1.5 / own_x:>11.2f}x")
                if args.baseline_ref is not None:
                    row = f"{c:>4} {eng.cell():>16} {r['baseline'].cell():>16} {eng.over(r['baseline']):>15}"
                    if args.bound:
                        g, bg = r["current greedy"], r["baseline greedy"]
                        row += f" {g.cell():>16} {bg.cell():>16} {g.over(bg):>15}"
                    tables["baseline"].append(row)
                print(f"  level {c} done", flush=True)
            print("\nengine (T=1, log-probs) vs HF generate (T=1)")
            print(f"{'conc':>4} {'engine':>16} {'HF sequential':>16} {'HF batched':>16} {'vs seq':>15} "
                  f"{'vs batched':>15}")
            print("\n".join(tables["main"]))
            if args.bound:
                print("\nengine at greedy without log-probs vs the bare greedy loop (its bound)")
                print(f"{'conc':>4} {'engine greedy':>16} {'bare loop':>16} {'of bound':>15} {'own model loop':>16} "
                      f"{'own/HFb':>10} {'1.5x HFb is':>12}")
                print("\n".join(tables["bound"]))
                print("own model loop: the bare loop on the engine's own model implementation (no scheduler, sampler or\n"
                      "HTTP); own/HFb: its wall rate over HF batched generate (T=1); '1.5x HFb is': that goal as a\n"
                      "multiple of the own model loop (above 1.00x: faster than the model itself runs on this machine)")
            if args.baseline_ref is not None:
                print("\nthis checkout's engine vs the baseline's (same requests, interleaved)")
                head = f"{'conc':>4} {'T=1 lp now':>16} {'T=1 lp base':>16} {'now/base':>15}"
                if args.bound:
                    head += f" {'greedy now':>16} {'greedy base':>16} {'now/base':>15}"
                print(head)
                print("\n".join(tables["baseline"]))
        finally:
            for e in engines.values():
                e.stop()


if __name__ == "__main__":
    main()
