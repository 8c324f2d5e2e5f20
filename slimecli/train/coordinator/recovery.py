"""An engine lost mid-run: rank 0's side of its restart (the supervisor's side: launch/restarts.py).

A request that finds its engine gone (refused, reset, or a restarted engine's 503 "waits for the trainer's
weights") waits here, as does every later request to that engine: until the engine answers /health_generate
again, then until it holds the weights last pushed (the weight sync's resync; an engine lost again meanwhile, e.g.
stopped once ready and restarted, is waited for again). Then the requests are sent again;
each sample's own sampling seed makes the tokens the same as the lost ones under the same weights. Where the
supervisor's restart budget runs out, the run is stopped by it; the wait here is bounded by that budget too.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import aiohttp

from slimecli.config.schema import SlimeConfig
from slimecli.rollout.client import EngineError, engine_lost

if TYPE_CHECKING:
    from slimecli.train.coordinator.weights import EngineWeights

log = logging.getLogger("slimecli.train")


class EngineRecovery:
    def __init__(self, cfg: SlimeConfig, weights: EngineWeights) -> None:
        r = cfg.rollout
        self.weights = weights
        # each restart: noticed within a health timeout (a hang) and started within start_timeout_s
        self.wait_s = (r.health_timeout_s + r.health_interval_s + r.start_timeout_s + 30.0) * max(1, r.max_restarts)
        self.recovered = 0

    async def __call__(self, engine: Any) -> None:
        log.warning("engine %s is gone: waiting for its restart (rollout.max_restarts)", engine.base_url)
        deadline = time.monotonic() + self.wait_s
        while True:
            await engine.wait_ready(max(1.0, deadline - time.monotonic()))
            try:
                version = await self.weights.resync(engine)
                break
            except (aiohttp.ClientError, EngineError) as exc:
                if not engine_lost(exc) or time.monotonic() >= deadline:
                    raise
                log.warning("engine %s went away again before it took the weights (%s): waiting for its restart",
                            engine.base_url, exc)
        self.recovered += 1
        log.warning("engine %s is back, serving weight version %s", engine.base_url, version)


def wants_recovery(cfg: SlimeConfig) -> bool:
    """Engines are restarted in this run (launch/plan.py: none with trainer.weight_sync=nccl)."""
    return cfg.rollout.max_restarts > 0 and cfg.trainer.weight_sync != "nccl"
