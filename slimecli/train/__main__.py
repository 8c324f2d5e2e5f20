"""Trainer worker entry: `torchrun ... -m slimecli.train --config RUN/config.yaml`."""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    from slimecli.launch.watchdog import start_parent_watchdog

    start_parent_watchdog()
    parser = argparse.ArgumentParser(prog="python -m slimecli.train")
    parser.add_argument("--config", required=True, help="the resolved config.yaml of the run")
    args = parser.parse_args(argv)
    from slimecli.config.errors import ConfigErrors
    from slimecli.config.io import load_frozen
    from slimecli.config.layout import run_dir_of

    try:
        cfg = load_frozen(args.config)
    except (OSError, ConfigErrors) as exc:
        print(f"cannot read {args.config}: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=cfg.run.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    import aiohttp

    from slimecli.model.loading import set_trust_remote_code

    set_trust_remote_code(cfg.model.trust_remote_code)  # the tokenizer, rank 0's agent renderer

    from slimecli.rollout.client import EngineError
    from slimecli.train import dist
    from slimecli.train.loop import Trainer

    try:
        Trainer(cfg, run_dir_of(args.config)).run()
    except (TimeoutError, EngineError, aiohttp.ClientError) as exc:  # a server went away: say which, no traceback
        print(f"trainer: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        dist.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
