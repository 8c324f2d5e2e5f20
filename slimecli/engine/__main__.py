"""`python -m slimecli.engine --config RUN/config.yaml [--index i | --judge]`: engine i of a run, or its
embedded judge."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slimecli.config.schema import SlimeConfig
    from slimecli.engine.settings import EngineSettings

log = logging.getLogger("slimecli.engine")


def main(argv: list[str] | None = None) -> None:
    from slimecli.config.layout import run_dir_of
    from slimecli.observe import startup
    from slimecli.observe.worker import start_worker

    def arguments(p: Any) -> None:
        p.add_argument("--index", type=int, default=0, help="Engine index: listens on rollout.port + index.")
        p.add_argument("--judge", action="store_true", help="Serve the run's embedded judge (reward.judge_url="
                       "embedded) on reward.judge_port instead of a rollout engine.")

    cfg, args = start_worker("python -m slimecli.engine", argv, __doc__, log_format=None,  # start() logs
                             arguments=arguments)
    startup.name("judge" if args.judge else f"engine-{args.index}")
    if args.judge:
        from slimecli.engine.app import run

        run(judge_settings(cfg))
        return
    start(cfg, args.index, run_dir_of(args.config))


def weight_roots(cfg: SlimeConfig, run_dir: str | Path | None,
                 model_path: str | Path | None = None) -> list[str | Path]:
    """rollout.weight_roots, or the run directory ($SLIMECLI_RUN_DIR, run.dir, else the one given) and the
    served model's directory (where clients on other hosts may load from; loopback clients load anywhere)."""
    if cfg.rollout.weight_roots:
        return list(cfg.rollout.weight_roots)
    run = os.environ.get("SLIMECLI_RUN_DIR") or cfg.run.dir or run_dir
    roots: list[str | Path] = [run] if run is not None else []
    if model_path is not None and Path(model_path).is_dir():
        roots.append(model_path)
    return roots


def on_gpu(device: str) -> bool:
    """Whether rollout.device puts the embedded engine on a GPU."""
    import torch

    return device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())


def settings_of(cfg: SlimeConfig, index: int = 0, run_dir: str | Path | None = None) -> EngineSettings:
    """Engine `index`'s settings from the run config; run_dir: where update_weights_from_disk may load from
    when rollout.weight_roots is not set."""
    from slimecli.config.groups.rollout import engine_dtype
    from slimecli.config.layout import engine_slot
    from slimecli.engine.settings import EngineSettings
    from slimecli.model.loading import resolve_model_path, resolve_tokenizer_path
    from slimecli.net.auth import engine_api_key

    model_path = resolve_model_path(cfg.model)
    r = cfg.rollout
    slot = engine_slot(cfg, index)
    return EngineSettings(
        str(model_path), tokenizer_path=str(resolve_tokenizer_path(cfg.model)), host=slot.host, port=slot.port,
        dtype=engine_dtype(r, cfg.model.dtype, on_gpu(r.device)), device=r.device,
        max_running=r.max_running_requests, seed=cfg.run.seed + index, prefix_cache_mb=r.prefix_cache_mb,
        trust_remote_code=cfg.model.trust_remote_code, log_level=cfg.run.log_level,
        api_key=engine_api_key(r.api_key), weight_roots=tuple(map(str, weight_roots(cfg, run_dir, model_path))),
        read_timeout_s=r.read_timeout_s, max_connections=r.max_connections, loopback_loads_anywhere=not r.weight_roots)


def judge_settings(cfg: SlimeConfig) -> EngineSettings:
    """The embedded judge's settings: reward.judge_model (default: the run's model) on reward.judge_port, on the
    rollout engines' device (rollout.device) and dtype, behind reward.judge_api_key (the key its clients send). It
    loads no weight updates (no weight roots): it judges as it started."""
    from pathlib import Path

    from slimecli.config.groups.rollout import engine_dtype
    from slimecli.config.layout import embedded_judge, picked
    from slimecli.engine.settings import EngineSettings
    from slimecli.model.loading import resolve_model_path, resolve_tokenizer_path
    from slimecli.net.auth import judge_api_key

    judge = embedded_judge(cfg)
    if judge is None:
        raise SystemExit("python -m slimecli.engine --judge: this config has no embedded judge "
                         "(reward=judge reward.judge_url=embedded)")
    r = cfg.rollout
    if judge.judge_model:
        model_path = tokenizer_path = Path(judge.judge_model)
    else:
        model_path, tokenizer_path = resolve_model_path(cfg.model), resolve_tokenizer_path(cfg.model)
    return EngineSettings(
        str(model_path), tokenizer_path=str(tokenizer_path), host=judge.judge_host,
        port=picked(judge.judge_port, "reward.judge_port"), dtype=engine_dtype(r, cfg.model.dtype, on_gpu(r.device)),
        device=r.device, max_running=r.max_running_requests, seed=cfg.run.seed, prefix_cache_mb=r.prefix_cache_mb,
        trust_remote_code=cfg.model.trust_remote_code, log_level=cfg.run.log_level,
        api_key=judge_api_key(judge.judge_api_key), weight_roots=(),
        read_timeout_s=r.read_timeout_s, max_connections=r.max_connections, loopback_loads_anywhere=False)


def start(cfg: SlimeConfig, index: int = 0, run_dir: str | Path | None = None) -> None:
    """Serve engine `index` of this config (blocks)."""
    from slimecli.engine.app import run
    from slimecli.observe import startup

    startup.mark("imported")
    run(settings_of(cfg, index, run_dir))


if __name__ == "__main__":
    main()
    from slimecli.quick_exit import exit_now

    exit_now(0)  # stopped: without the teardown of torch's and transformers' modules (a second of CPU)
