"""StatelessAdam against torch.optim.AdamW(foreach=True) on a >= 50M-parameter model on CPU.

Side by side in one process: optimizer-state bytes after a step (goal: 0 for StatelessAdam,
2x parameter bytes for AdamW) and step time (goal: ratio <= 1.0). Each optimizer owns its own
copy of the model; steps are interleaved so machine noise hits both alike, and the median counts.
Also checks that the two agree on a first step (AdamW from fresh state).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from slimecli.train.optim.stateless_adam import StatelessAdam


def make_model(width: int, depth: int, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)]).to(dtype)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3  # a backward pass is not what is measured
    return model


def state_bytes(opt: torch.optim.Optimizer) -> int:
    return sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
               if torch.is_tensor(v) and v.dim() > 0)  # per-param step counters are scalars


def timed_step(opt: torch.optim.Optimizer) -> float:
    start = time.perf_counter()
    opt.step()
    return time.perf_counter() - start


def run(width: int, depth: int, rounds: int, dtype: torch.dtype) -> None:
    ours_model, base_model = make_model(width, depth, dtype), make_model(width, depth, dtype)
    n_params = sum(p.numel() for p in ours_model.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in ours_model.parameters())
    hp = dict(lr=1e-6, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    ours = StatelessAdam(ours_model.parameters(), **hp)
    base = torch.optim.AdamW(base_model.parameters(), **hp, foreach=True)

    timed_step(ours)  # first steps: allocate AdamW's moments, warm allocators and caches
    timed_step(base)
    worst = max((a - b).abs().max().item() for a, b in zip(ours_model.parameters(), base_model.parameters(),
                                                             strict=True))
    t_ours, t_base = [], []
    for i in range(rounds):  # alternate who goes first
        if i % 2:
            t_base.append(timed_step(base))
            t_ours.append(timed_step(ours))
        else:
            t_ours.append(timed_step(ours))
            t_base.append(timed_step(base))
    s_ours, s_base = state_bytes(ours), state_bytes(base)
    m_ours, m_base = statistics.median(t_ours), statistics.median(t_base)

    print(f"model: {depth} x Linear({width},{width}) {str(dtype).removeprefix('torch.')}, "
          f"{n_params / 1e6:.1f}M params, {param_bytes / 2**20:.0f} MiB; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; first-step max |diff| vs AdamW {worst:.1e}")
    print(f"optimizer state: StatelessAdam {s_ours} B, AdamW {s_base} B "
          f"({s_base / param_bytes:.2f}x param bytes); stateless/AdamW = {s_ours / s_base:.2f} (goal 0)")
    print(f"step time: StatelessAdam median {m_ours * 1000:.1f} ms, AdamW(foreach) median {m_base * 1000:.1f} ms "
          f"over {rounds} steps; ratio stateless/AdamW = {m_ours / m_base:.2f} (goal <= 1.0)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=12)  # 12 x (2048^2 + 2048) = 50.4M parameters
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--fp32-only", action="store_true", help="skip the bf16-parameter run")
    args = parser.parse_args()
    run(args.width, args.depth, args.rounds, torch.float32)
    if not args.fp32_only:
        run(args.width, args.depth, args.rounds, torch.bfloat16)


if __name__ == "__main__":
    main()
