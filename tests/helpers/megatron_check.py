"""Run on gloo ranks: one scoring pass and one optimizer update through trainer=megatron's back-end.

    python -m slimecli.launch.ranks --nproc N -m tests.helpers.megatron_check OUT MODEL TP PP OPTIMIZER [sp] [export]

Rank 0 writes OUT/result.json: the scored log-probs, the update's metrics and the whole model after the
update (HF names, as lists). The pytest side runs the same batch through trainer=torch in its own process
and compares. ``fixed_batch``/``check_cfg`` are imported by both sides, so they see the same inputs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import torch

from slimecli.config.schema import SlimeConfig
from slimecli.rollout.sample import Sample
from slimecli.train.stages import StepBatch

TEMPERATURE = 0.7


LR = 1e-2  # large enough that one update moves every weight visibly


def check_cfg(model_dir: str, tp: int = 1, pp: int = 1, optimizer: str = "adam", name: str = "megatron",
              sequence_parallel: bool = False, dp: int = 1) -> SlimeConfig:
    base = SlimeConfig()
    return dataclasses.replace(
        base,
        model=dataclasses.replace(base.model, path=model_dir),
        trainer=dataclasses.replace(base.trainer, name=name, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                                    global_batch_size=4, micro_batch_size=2, nproc=tp * pp * dp,
                                    sequence_parallel=sequence_parallel),
        rollout=dataclasses.replace(base.rollout, batch_size=2, n_samples_per_prompt=2, temperature=TEMPERATURE),
        optimizer=dataclasses.replace(base.optimizer, name=optimizer, lr=LR, clip_grad=0.5))


def fixed_batch(vocab: int) -> StepBatch:
    """Four samples of different lengths (so micro-batches pad), one with a masked response token."""
    g = torch.Generator().manual_seed(7)
    samples = []
    for i, (n, r) in enumerate([(9, 4), (7, 3), (12, 5), (6, 2)]):
        tokens = torch.randint(0, vocab, (n,), generator=g).tolist()
        mask = [1, 0, 1, 1, 1][:r] if i == 2 else None
        samples.append(Sample(index=i, group_index=i // 2, tokens=tokens, response_length=r, loss_mask=mask))
    return StepBatch(samples, [1.0, 0.0, 0.25, 0.75], {})


def run(cfg: SlimeConfig, batch: StepBatch, export: bool = False) -> dict[str, object]:
    """Score, then one update (stages.update) through the back-end cfg.trainer.name names. ``export``: also
    measure the weight export message by message against the whole-stage gather it replaced
    (tests/helpers/megatron_export_check.py)."""
    from slimecli.train import dist, stages
    from slimecli.train.loop import make_policy
    from slimecli.train.optim.build import build_scheduler
    from slimecli.train.stages import RankContext, StepTensors

    info = dist.init("gloo")
    policy = make_policy(cfg, info)
    ctx = RankContext(0, cfg.trainer.micro_batch_size, TEMPERATURE, info.device, policy.data_rank, policy.data_size)
    scored = stages.score(policy, batch.samples, ctx)
    scheduler = build_scheduler(policy.lr_optimizer(), cfg.optimizer, cfg.trainer.max_steps)
    adv = stages.advantages(batch, None, None, cfg.trainer, cfg.rollout.n_samples_per_prompt)
    metrics = stages.update(policy, scheduler, batch, StepTensors(None, None, adv), cfg, ctx)
    state = policy.full_state_dict(info.is_main)
    config = getattr(policy, "config", None)  # megatron-core's TransformerConfig (trainer=megatron)
    exported = None
    if export:
        from tests.helpers.megatron_export_check import measure_export

        exported = measure_export(policy, info.is_main)
    return {"rank": info.rank, "export": exported, "logp": [t.tolist() for t in scored], "metrics": metrics,
            "sequence_parallel": bool(getattr(config, "sequence_parallel", False)),
            "distributed_optimizer": bool(getattr(policy, "distributed_optimizer", False)),
            "state": {k: v.tolist() for k, v in state.items()} if state is not None else None}


def main() -> int:
    out, model_dir, tp, pp, optimizer = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    sequence_parallel = "sp" in sys.argv[6:]
    dp = int(os.environ.get("WORLD_SIZE", "1")) // (tp * pp)  # the ranks started beyond one replica
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    result = run(check_cfg(model_dir, tp, pp, optimizer, sequence_parallel=sequence_parallel, dp=dp),
                 fixed_batch(vocab), export="export" in sys.argv[6:])
    if result["rank"] == 0:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "result.json").write_text(json.dumps(result))
    from slimecli.train import dist

    dist.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
