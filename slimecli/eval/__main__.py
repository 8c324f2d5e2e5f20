"""Evaluator worker of `slimecli eval`: `python -m slimecli.eval --config RUN/config.yaml --step N`.

It waits for the run's engines, evaluates eval.datasets once (RUN/eval/step_<N>/), appends the metrics row to
RUN/metrics.jsonl and exits 0 once the summary is written, whether or not every dataset could be evaluated
(the command reads the summary and decides); 1 when an engine could not be reached.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from slimecli.config.schema import SlimeConfig


async def _evaluate(cfg: SlimeConfig, run_dir: Path, step: int) -> int:
    from slimecli.config.layout import engine_slots
    from slimecli.eval.runner import Evaluator, flat_metrics, headline
    from slimecli.model.loading import load_tokenizer
    from slimecli.observe import startup
    from slimecli.observe.metrics import MetricsLogger
    from slimecli.rollout.client import EngineClient

    r = cfg.rollout
    engines = [EngineClient(slot.url, timeout_s=r.request_timeout_s, api_key=r.api_key)
               for slot in engine_slots(cfg)]
    # opened while the engines load, not after the evaluation: TensorBoard's writer imports in 0.1 s
    with MetricsLogger(run_dir, observe=cfg.observe) as metrics:
        try:
            await asyncio.gather(*(e.wait_ready(r.start_timeout_s) for e in engines))
            startup.mark("ready")
            evaluator = Evaluator(cfg, load_tokenizer(cfg.model.resolved_tokenizer_path), engines, run_dir)
            results = await evaluator.evaluate(step)
        finally:
            for engine in engines:
                close = getattr(engine, "close", None)
                if close is not None:
                    await close()
        metrics.log(step, {**flat_metrics(results), "eval/weight_version": step})
    print(f"evaluator: step {step}: {headline(results)}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    from slimecli.launch.watchdog import start_parent_watchdog

    start_parent_watchdog()
    from slimecli.observe.worker import start_worker

    cfg, args = start_worker("python -m slimecli.eval", argv, arguments=lambda p: p.add_argument(
        "--step", type=int, default=0, help="the training step of the weights (names eval/step_N)"))
    from slimecli.observe import startup

    startup.name("evaluator")
    import aiohttp

    from slimecli.model.loading import set_trust_remote_code
    from slimecli.rollout.client import EngineError

    set_trust_remote_code(cfg.model.trust_remote_code)
    startup.mark("imported")
    try:
        return asyncio.run(_evaluate(cfg, Path(args.config).resolve().parent, args.step))
    except (TimeoutError, EngineError, aiohttp.ClientError) as exc:
        print(f"evaluator: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
