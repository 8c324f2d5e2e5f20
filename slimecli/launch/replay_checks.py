"""Pre-flight of rollout.replay: the dumped steps a replay trains on are there, and so is the checkpoint each
replayed step starts from."""

from __future__ import annotations

from slimecli.checkpoint.layout import is_complete, step_dirs
from slimecli.config.errors import ConfigError
from slimecli.config.schema import SlimeConfig
from slimecli.rollout.dump import dump_dir, dumped_run, dumped_steps


def replay_errors(cfg: SlimeConfig) -> list[ConfigError]:
    r = cfg.rollout
    if not r.replay:
        return []
    root = dump_dir(r.replay)
    have = set(dumped_steps(root)) if root.is_dir() else set()
    if not have:
        return [ConfigError("rollout.replay", r.replay, "holds no rollout dump (rollouts/step_<k>.jsonl)",
                            "name a run directory trained with rollout.dump=true, or its rollouts/ folder")]
    steps = list(r.replay_steps) or list(range(1, cfg.trainer.max_steps + 1))
    missing = [k for k in steps if k not in have]
    if missing:
        what = f"step {missing[0]}" if len(missing) == 1 else f"steps {missing[0]}..{missing[-1]} ({len(missing)})"
        key, value = ("rollout.replay_steps", list(r.replay_steps)) if r.replay_steps else \
            ("trainer.max_steps", cfg.trainer.max_steps)
        return [ConfigError(key, value, f"{root} has no dump of {what}",
                            f"dumped: steps {min(have)}..{max(have)}; replay those")]
    if not r.replay_steps:
        return []
    run = dumped_run(r.replay)
    checkpoints = {step: path for step, path in step_dirs(run) if is_complete(path)} if run is not None else {}
    lacking = [k for k in r.replay_steps if k > 1 and k - 1 not in checkpoints]
    if lacking:
        return [ConfigError("rollout.replay_steps", list(r.replay_steps),
                            f"replaying step {lacking[0]} alone starts from the dumped run's checkpoint of step "
                            f"{lacking[0] - 1}, and there is none" + (f" in {run}" if run is not None else ""),
                            f"checkpoints there: {sorted(checkpoints) or 'none'} (a run with trainer.save_interval=1 "
                            "trainer.keep_checkpoints=0 keeps one of every step); or replay from step 1 without "
                            "rollout.replay_steps")]
    return []
