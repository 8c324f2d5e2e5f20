"""Trainer worker entry: `torchrun ... -m slimecli.train --config RUN/config.yaml`."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from slimecli.launch.watchdog import start_parent_watchdog

    start_parent_watchdog()
    from slimecli.config.layout import run_dir_of
    from slimecli.observe.worker import start_worker

    cfg, args = start_worker("python -m slimecli.train", argv)
    import os

    from slimecli.observe import startup

    startup.name(f"trainer rank {os.environ.get('RANK', '0')}")
    import aiohttp

    from slimecli.model.loading import set_trust_remote_code

    set_trust_remote_code(cfg.model.trust_remote_code)  # the tokenizer, rank 0's agent renderer

    from slimecli.rollout.client import EngineError
    from slimecli.train import dist
    from slimecli.train.coordinator.teacher import TeacherRefused
    from slimecli.train.loop import Trainer

    startup.mark("imported")

    try:
        Trainer(cfg, run_dir_of(args.config)).run()
    except (TimeoutError, EngineError, aiohttp.ClientError) as exc:  # a server went away: say which, no traceback
        print(f"trainer: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except TeacherRefused as exc:  # a teacher the run cannot distil from: the reason, no traceback
        print(f"trainer: refused: {exc}", file=sys.stderr)
        return 2
    finally:
        dist.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
