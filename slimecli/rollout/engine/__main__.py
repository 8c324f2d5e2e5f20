"""`python -m slimecli.rollout.engine --config RUN/config.yaml [--index i]`: engine i of a run."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slimecli.config.schema import SlimeConfig


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m slimecli.rollout.engine", description=__doc__)
    parser.add_argument("--config", required=True, help="The run's frozen config.yaml.")
    parser.add_argument("--index", type=int, default=0, help="Engine index: listens on rollout.port + index.")
    args = parser.parse_args(argv)

    from slimecli.config.io import load_frozen_or_exit

    cfg = load_frozen_or_exit(args.config)
    start(cfg, args.index)


def start(cfg: SlimeConfig, index: int = 0) -> None:
    """Serve engine `index` of this config (blocks)."""
    from slimecli.model.loading import resolve_model_path, resolve_tokenizer_path
    from slimecli.rollout.engine.app import run

    model_path = resolve_model_path(cfg.model)
    r = cfg.rollout
    run(model_path, host=r.host, port=r.port + index, tokenizer_path=resolve_tokenizer_path(cfg.model),
        dtype=cfg.model.dtype, max_running=r.max_running_requests, seed=cfg.run.seed + index, device=r.device,
        prefix_cache_mb=r.prefix_cache_mb, trust_remote_code=cfg.model.trust_remote_code,
        log_level=cfg.run.log_level)


if __name__ == "__main__":
    main()
