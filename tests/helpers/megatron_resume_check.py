"""Run on gloo ranks: trainer=megatron's sharded checkpoint, saved at one layout, resumed at another.

    python -m slimecli.launch.ranks --nproc TPxDP -m tests.helpers.megatron_resume_check MODE OUT MODEL_DIR TP

MODE straight: two updates, then the gathered weights to OUT/straight-LAYOUT.json. save: one update, then
policy.save_sharded(OUT/sharded). save-straight: both (the save between the updates). resume:
policy.load_sharded(OUT/sharded), the second update, the weights to OUT/resume-LAYOUT.json. LAYOUT is TP, or
TPxDP when DP > 1. A resume must give the straight run's weights whatever TP and DP the save had.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.helpers.megatron_check import TEMPERATURE, check_cfg, fixed_batch


def main() -> int:
    from transformers import AutoConfig

    from slimecli.train import dist, stages
    from slimecli.train.loop import make_policy
    from slimecli.train.optim.build import build_scheduler
    from slimecli.train.stages import RankContext, StepTensors

    mode, out, model_dir, tp = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    dp = int(os.environ.get("WORLD_SIZE", "1")) // tp  # the ranks beyond one replica: data parallel
    cfg = check_cfg(model_dir, tp, 1, "adam", dp=dp)
    batch = fixed_batch(AutoConfig.from_pretrained(model_dir).vocab_size)
    info = dist.init("gloo")
    policy = make_policy(cfg, info)
    ctx = RankContext(0, cfg.trainer.micro_batch_size, TEMPERATURE, info.device, policy.data_rank, policy.data_size)
    scheduler = build_scheduler(policy.lr_optimizer(), cfg.optimizer, cfg.trainer.max_steps)
    tensors = StepTensors(None, None, stages.advantages(batch, None, None, cfg.trainer, cfg.rollout.n_samples_per_prompt))
    if mode in ("straight", "save", "save-straight"):
        stages.update(policy, scheduler, batch, tensors, cfg, ctx)
    if mode.startswith("save"):
        policy.save_sharded(out / "sharded", with_optimizer=True)
        mode = mode.removeprefix("save-")
    if mode != "save":
        if mode == "resume":
            policy.load_sharded(out / "sharded", with_optimizer=True)
            scheduler.step()  # the schedule is the trainer's (scheduler.pt), not the back-end's
        stages.update(policy, scheduler, batch, tensors, cfg, ctx)
        state = policy.full_state_dict(info.is_main)
        if state is not None:
            name = f"{mode}-{tp}x{dp}" if dp > 1 else f"{mode}-{tp}"
            (out / f"{name}.json").write_text(json.dumps({k: v.tolist() for k, v in state.items()}))
    dist.shutdown()
    return 0


if __name__ == "__main__":  # megatron-core's checkpoint code may start helper processes (spawn)
    sys.exit(main())
