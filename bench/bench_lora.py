"""LoRA against full fine-tuning, side by side in one process, on the qwen3_0_6b architecture with random weights
(no download): bytes pushed per weight sync and its time (the trainer writes, the engine reads and applies),
optimizer-state bytes, and the time of one training step (forward, backward, AdamW step). Then the engine's
choice: generation forwards of the merged model against the same model serving the adapter unmerged (peft).

Goals (issue 34): LoRA sync bytes <= 0.05x full, LoRA step time <= 1.1x full.

    python bench/bench_lora.py [--layers 28] [--rank 8] [--reps 3] [--seq 128] [--batch 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from slimecli.config.groups.lora import LoraConfig  # noqa: E402
from slimecli.config.groups.model import ModelConfig  # noqa: E402
from slimecli.config.groups.trainer import TrainerConfig  # noqa: E402
from slimecli.config.schema import SlimeConfig  # noqa: E402


def qwen3_0_6b(layers: int) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=layers,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                       max_position_embeddings=4096)


def median_s(fn: Any, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=2)
    a = ap.parse_args()
    from transformers import AutoModelForCausalLM

    from slimecli.checkpoint.tensors import dedupe_views
    from slimecli.engine.adapters import AdapterRoutes
    from slimecli.model.lora import read_adapter
    from slimecli.train.hf_export import export_hf
    from slimecli.train.lora import adapter_state, wrap, write_adapter

    torch.manual_seed(0)
    tmp = Path(tempfile.mkdtemp(prefix="bench-lora-"))
    base_dir = tmp / "base"
    AutoModelForCausalLM.from_config(qwen3_0_6b(a.layers)).save_pretrained(base_dir)
    cfg = SlimeConfig(model=ModelConfig(name="qwen3_0_6b", path=str(base_dir)),
                      trainer=TrainerConfig(lora=LoraConfig(rank=a.rank)))
    full = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).train()
    lora = wrap(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32), cfg).train()
    engine = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    ids = torch.randint(0, 151936, (a.batch, a.seq))
    print(f"qwen3_0_6b architecture, {a.layers} layers, random weights; LoRA rank {a.rank} on "
          f"{', '.join(cfg.trainer.lora.targets('qwen3_0_6b'))}; batch {a.batch} x {a.seq} tokens; "
          f"{torch.get_num_threads()} threads")

    def optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, foreach=True)

    opts = {"full": optimizer(full), "lora": optimizer(lora)}

    def step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        out = model(input_ids=ids, use_cache=False, logits_to_keep=ids.shape[1] // 2)
        out.logits.float().logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    rows: dict[str, dict[str, float]] = {"full": {}, "lora": {}}
    step_times: dict[str, list[float]] = {"full": [], "lora": []}
    for _ in range(a.reps):  # interleaved: both see the same load
        for kind, model in (("full", full), ("lora", lora)):
            t = time.perf_counter()
            step(model, opts[kind])
            step_times[kind].append(time.perf_counter() - t)
    for kind in rows:
        rows[kind]["step_s"] = statistics.median(step_times[kind][1:] or step_times[kind])
        rows[kind]["optimizer_bytes"] = nbytes(t for s in opts[kind].state.values() for t in s.values()
                                               if torch.is_tensor(t) and t.ndim > 0)

    full_state, _ = dedupe_views({k: v.detach() for k, v in full.state_dict().items()})
    adapter = adapter_state(lora.state_dict())
    rows["full"]["sync_bytes"] = nbytes(full_state.values())
    rows["lora"]["sync_bytes"] = nbytes(adapter.values())

    def full_sync() -> None:
        out = export_hf(full_state, base_dir, tmp / "full-sync")
        from safetensors.torch import load_file

        loaded = load_file(str(out / "model.safetensors"))
        targets = engine.state_dict(keep_vars=True)
        with torch.no_grad():
            for k, v in loaded.items():
                targets[k].copy_(v)

    routes = AdapterRoutes.__new__(AdapterRoutes)
    routes.base, routes.loaded, routes.merged = {}, {}, None

    def lora_sync() -> None:
        out = write_adapter(adapter, cfg, tmp / "lora-sync")
        config, tensors = read_adapter(out)
        from slimecli.model.lora import deltas, merged

        targets = engine.state_dict(keep_vars=True)
        with torch.no_grad():
            for name, (a_, b_, scale) in deltas(config, tensors, targets).items():
                base = routes.base.setdefault(name, targets[name].detach().clone())
                targets[name].copy_(merged(base, a_, b_, scale))

    rows["full"]["sync_s"] = median_s(full_sync, a.reps)
    rows["lora"]["sync_s"] = median_s(lora_sync, a.reps)

    print(f"{'':18}{'full':>14}{'lora':>14}{'lora/full':>11}")
    for key, unit in (("sync_bytes", "MiB"), ("sync_s", "s"), ("optimizer_bytes", "MiB"), ("step_s", "s")):
        f, lo = rows["full"][key], rows["lora"][key]
        scale = 2**20 if unit == "MiB" else 1
        print(f"{key:18}{f / scale:>12.3f}{unit[:1]:>2}{lo / scale:>12.3f}{unit[:1]:>2}{lo / f:>10.4f}x")

    # the engine's choice: merged weights vs the adapter served unmerged (peft's forward), a decode-sized batch
    gen_ids = torch.randint(0, 151936, (16, 8))
    lora.eval()
    with torch.no_grad():
        merged_s = median_s(lambda: engine(input_ids=gen_ids, use_cache=False, logits_to_keep=1), a.reps)
        unmerged_s = median_s(lambda: lora(input_ids=gen_ids, use_cache=False, logits_to_keep=1), a.reps)
    print(f"engine forward (16 x 8 tokens): merged {merged_s * 1e3:.1f} ms, adapter unmerged {unmerged_s * 1e3:.1f} "
          f"ms ({unmerged_s / merged_s:.2f}x); merge kept {nbytes(routes.base.values()) / 2**20:.0f} MiB of base weights")


if __name__ == "__main__":
    main()
