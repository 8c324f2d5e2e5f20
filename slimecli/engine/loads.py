"""GET /v1/loads: the engine's load in SGLang's shape (sglang/srt/entrypoints/v1_loads.py).

`{"timestamp": ISO-8601, "version", "accelerator", "num_accelerators", "loads": [per DP rank]}`; this engine
is one DP rank (0). A load has `dp_rank`, `timestamp` and, in section "core", num_running_reqs,
num_waiting_reqs, num_used_tokens, num_total_tokens (used + waiting prompt tokens), max_total_num_tokens,
token_usage, gen_throughput, cache_hit_rate, utilization, max_running_requests; section "queues" is
{waiting, grammar, paused, retracted}. SGLang's other sections (memory, spec, lora, disagg) describe
features this engine lacks and are left out. Query: `include` (comma-separated sections; an unknown one is a
400 like SGLang's), `dp_rank` (only 0 exists), `format=prometheus` (gauges `sglang_<name>{dp_rank="0"}`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from slimecli import __version__
from slimecli.engine.core import EngineCore
from slimecli.net.server import HttpError, json_response

SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})


def parse_query(query: Mapping[str, str]) -> tuple[set[str] | None, str]:
    include = [s.strip() for s in query.get("include", "").split(",") if s.strip()] or None
    bad = sorted(set(include or ()) - SECTIONS)
    if bad:
        raise HttpError(400, f"include: invalid section(s) {', '.join(bad)[:200]}; valid: {', '.join(sorted(SECTIONS))}")
    rank = query.get("dp_rank")
    if rank is not None and rank.strip() != "0":
        raise HttpError(400, f"dp_rank: this engine has one DP rank, 0 (got {rank[:40]!r})")
    fmt = query.get("format", "json")
    if fmt not in ("json", "prometheus"):
        raise HttpError(400, f"format: json or prometheus (got {fmt[:40]!r})")
    return (None if include is None or "all" in include else set(include)), fmt


def rank_load(server: EngineCore, include: set[str] | None) -> dict[str, Any]:
    """One DP rank's load from the engine's scheduler (read without stopping it)."""
    sch = server.scheduler
    out: dict[str, Any] = {"dp_rank": 0, "timestamp": time.time()}
    if sch is None:
        return out
    rows = list(sch.runner.rows)
    with sch._wake:  # the scheduler's lock over its waiting queue
        waiting = list(sch.waiting)
    used = sum(len(s.prompt_ids) + len(s.output_ids) for s in rows)
    pending = sum(len(s.prompt_ids) for s in waiting)
    context = int(getattr(server, "context_length", 0) or 0)
    capacity = max(1, server.max_running * context)
    st = sch.stats
    busy_s = float(st.get("prefill_s", 0.0)) + float(st.get("decode_s", 0.0))
    prefill = float(st.get("prefill_tokens", 0))
    if include is None or "core" in include:
        out.update({"num_running_reqs": len(rows), "num_waiting_reqs": len(waiting), "num_used_tokens": used,
                    "num_total_tokens": used + pending, "max_total_num_tokens": capacity,
                    "token_usage": used / capacity,
                    "gen_throughput": float(st.get("generated_tokens", 0)) / busy_s if busy_s > 0 else 0.0,
                    "cache_hit_rate": min(1.0, sch.prefix.hit_tokens / prefill) if prefill > 0 else 0.0,
                    "utilization": len(rows) / max(1, server.max_running),
                    "max_running_requests": server.max_running})
    if include is None or "queues" in include:
        out["queues"] = {"waiting": len(waiting), "grammar": 0, "paused": len(rows) if sch.paused else 0,
                         "retracted": 0}
    return out


def _accelerator(device: str) -> tuple[str | None, int]:
    if not device.startswith("cuda"):
        return None, 0
    import torch

    return torch.cuda.get_device_name(torch.device(device)), 1


def _prometheus(load: dict[str, Any]) -> web.Response:
    lines: list[str] = []
    for key, value in load.items():
        if key == "dp_rank":
            continue
        items = ((f"{key}_{k}", v) for k, v in value.items()) if isinstance(value, dict) else [(key, value)]
        for name, v in items:
            if isinstance(v, int | float) and not isinstance(v, bool):
                lines += [f"# TYPE sglang_{name} gauge", f'sglang_{name}{{dp_rank="0"}} {v}']
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain",
                        headers={"X-Content-Format": "prometheus-0.0.4"})


async def handle(server: EngineCore, request: web.Request) -> web.Response:
    include, fmt = parse_query(request.query)
    load = rank_load(server, include)
    if fmt == "prometheus":
        return _prometheus(load)
    accelerator, count = _accelerator(str(server.device))
    return json_response({"timestamp": datetime.now(UTC).isoformat(), "version": __version__,
                          "accelerator": accelerator, "num_accelerators": count, "loads": [load]})
