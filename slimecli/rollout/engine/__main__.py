"""`python -m slimecli.rollout.engine --config RUN/config.yaml [--index i]`: engine i of a run."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m slimecli.rollout.engine", description=__doc__)
    parser.add_argument("--config", required=True, help="The run's frozen config.yaml.")
    parser.add_argument("--index", type=int, default=0, help="Engine index: listens on rollout.port + index.")
    args = parser.parse_args(argv)

    from slimecli.cli.common import load_frozen_or_exit

    cfg = load_frozen_or_exit(args.config)
    start(cfg, args.index)


def start(cfg, index: int = 0) -> None:  # noqa: ANN001 - SlimeConfig, imported lazily
    """Serve engine `index` of this config (blocks)."""
    from slimecli.model.loading import resolve_model_path, resolve_tokenizer_path
    from slimecli.rollout.engine.app import run

    model_path = resolve_model_path(cfg.model)
    r = cfg.rollout
    run(model_path, host=r.host, port=r.port + index, tokenizer_path=resolve_tokenizer_path(cfg.model),
        dtype=cfg.model.dtype, max_running=r.max_running_requests, seed=cfg.run.seed + index)


if __name__ == "__main__":
    main()
