"""trainer=megatron at TP=2 against trainer=torch DDP on 2 ranks, same model and batch, side by side; and
per-rank parameter memory at TP=2 against TP=1.

Step time: the quickstart (2 gloo ranks, the tiny model, the same rollout engine) for --steps steps per run,
torch and megatron interleaved (--repeats pairs) so machine noise hits both. Prints each side's mean
steady-state time/train_s (the trainer's stages: old_logp + ref_logp + advantages + update) and time/step_s,
and the ratios megatron / torch (goal on CPU, where TP brings no speed and costs communication: <= 1.3x).

Memory: `--param-bytes` is the worker mode: under torchrun it builds the megatron policy and prints this
rank's parameter bytes. The bench runs it at TP=1 and TP=2 and prints the ratio (goal <= 0.55).

    python bench/bench_megatron.py [--steps 12] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from bench_train_step import means, run_quickstart  # noqa: E402  # the sibling bench's quickstart runner

# DDP on 2 ranks splits each update's 64 samples over its replicas (one micro-batch of 32 per rank); TP=2 is
# one replica, so at the same trainer.micro_batch_size=32 each rank runs two micro-batches. "megatron-mb64"
# runs its 64 as one, so both sides make one forward and backward per rank per update: what is left is the
# cost of TP itself, on gloo a round trip for each of its all-reduces (two per layer each way, and the
# vocab-parallel log-softmax's), where DDP all-reduces the gradients once.
SIDES = {"torch": ["trainer=torch"], "megatron": ["trainer=megatron", "trainer.tensor_parallel_size=2"],
         "megatron-mb64": ["trainer=megatron", "trainer.tensor_parallel_size=2", "trainer.micro_batch_size=64"]}


def step_times(steps: int, repeats: int) -> None:
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="bench-megatron-") as tmp:
        for i in range(repeats):
            for side, overrides in SIDES.items():
                run_dir = Path(tmp) / f"{side}-{i + 1}"
                run_quickstart(run_dir, steps, ["trainer.nproc=2", *overrides])
                runs[side].append(means(run_dir))
                print(f"  {side:<13} run {i + 1}: train {runs[side][-1]['time/train_s'] * 1000:7.1f} ms  "
                      f"step {runs[side][-1]['time/step_s'] * 1000:7.1f} ms", flush=True)
    for key in ("time/train_s", "time/update_s", "time/step_s"):
        mean = {side: statistics.fmean(r[key] for r in rs) for side, rs in runs.items()}
        print(f"{key:<14} torch DDP {mean['torch'] * 1000:7.1f} ms   megatron TP=2 {mean['megatron'] * 1000:7.1f} ms"
              f" ({mean['megatron'] / mean['torch']:.2f}x)   TP=2 micro-batch 64 {mean['megatron-mb64'] * 1000:7.1f} ms"
              f" ({mean['megatron-mb64'] / mean['torch']:.2f}x)")


def param_bytes(tp: int) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node",
            str(tp), str(Path(__file__).resolve()), "--param-bytes", str(tp)]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"TP={tp} worker failed:\n{out.stderr[-3000:]}")
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return max(r["bytes"] for r in rows)


def worker(tp: int) -> None:
    """Under torchrun: this rank's parameter bytes of the quickstart model at TP=tp."""
    import dataclasses

    from slimecli.config.schema import SlimeConfig
    from slimecli.launch.preflight import materialize
    from slimecli.train import dist
    from slimecli.train.loop import make_policy

    base = materialize(SlimeConfig())
    cfg = dataclasses.replace(base, trainer=dataclasses.replace(base.trainer, name="megatron", nproc=tp,
                                                                tensor_parallel_size=tp))
    info = dist.init("gloo")
    policy = make_policy(cfg, info)
    module = policy.module  # type: ignore[attr-defined]  # MegatronPolicy
    size = sum(p.numel() * p.element_size() for p in module.parameters())
    print(json.dumps({"rank": info.rank, "bytes": size}), flush=True)
    dist.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--param-bytes", type=int, metavar="TP", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.param_bytes:
        worker(args.param_bytes)
        return 0
    one, two = param_bytes(1), param_bytes(2)
    print(f"parameter bytes per rank: TP=1 {one / 2**20:.2f} MiB, TP=2 {two / 2**20:.2f} MiB, "
          f"TP=2 / TP=1 = {two / one:.3f}")
    step_times(args.steps, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
