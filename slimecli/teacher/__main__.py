"""Entry point of every teacher rank: `python -m slimecli.teacher --config RUN/config.yaml [--teacher NAME]` under
torchrun (--teacher: which of the run's `teachers` it serves; without it, the `teacher` group's).

Rank 0 serves HTTP after a private warm-up request on an ephemeral loopback port has gone through the whole
path (HTTP, queue, every rank); only then does the public port open. A failed warm-up ends the job.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from datetime import timedelta
from pathlib import Path

import aiohttp
import torch
import torch.distributed as dist
from aiohttp import web

from slimecli.config.schema import SlimeConfig
from slimecli.net.listen import app_runner, start_site
from slimecli.observe import startup
from slimecli.teacher.ranks import exchanges, make_layout, serve_peer
from slimecli.teacher.server import Front
from slimecli.teacher.worker import TeacherWorker

log = logging.getLogger("slimecli.teacher")


def teacher_model_path(cfg: SlimeConfig) -> str:
    if cfg.teacher.model_path:
        return str(Path(cfg.teacher.model_path).expanduser().absolute())
    from slimecli.model.loading import resolve_model_path

    return str(resolve_model_path(cfg.model).absolute())


def warmup_body(vocab_size: int) -> dict:
    ids = [i % vocab_size for i in range(8)]
    return {"input_ids": ids, "sample_n": 2, "label_token_ids": [[0]] * (len(ids) - 1)}


async def warm_up(runner: web.AppRunner, cfg: SlimeConfig, vocab_size: int) -> None:
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
    headers = {"Authorization": f"Bearer {cfg.teacher.api_key}"} if cfg.teacher.api_key else {}
    body = warmup_body(vocab_size)
    try:
        timeout = aiohttp.ClientTimeout(total=cfg.teacher.warmup_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as s, s.post(
                f"http://127.0.0.1:{port}/generate", json=body, headers=headers) as r:
            reply = await r.json()
            if r.status != 200 or len(reply.get("log_probs", [])) != len(body["input_ids"]) - 1:
                raise RuntimeError(f"HTTP {r.status}: {reply}")
    except TimeoutError:
        raise RuntimeError(f"no answer within teacher.warmup_timeout_s={cfg.teacher.warmup_timeout_s:g}s") from None
    finally:
        await site.stop()


async def run_front(cfg: SlimeConfig, front: Front) -> None:
    from slimecli.config.layout import teacher_address

    t = cfg.teacher
    host, port = teacher_address(cfg, cfg.cluster.node_rank)  # this node's (teacher.every_node)
    runner = app_runner(front.app())  # closes connections whose request head stalls (slimecli.net.listen)
    await runner.setup()
    front.start_background()
    if t.warmup:
        try:
            await warm_up(runner, cfg, front.vocab_size)
        except Exception as exc:  # noqa: BLE001 - any warm-up failure: logged, and the rank exits
            log.error("teacher warm-up failed, not opening %s:%d: %s", host, port, exc)
            sys.stderr.flush()
            os._exit(1)  # torchrun then stops the other ranks
        log.info("warm-up request ok")
        front.reset_counters()
    await start_site(runner, host, port)  # a cap on open connections
    startup.mark("ready")
    log.info("teacher server on http://%s:%d  model=%s vocab=%d tp=%d dp=%d", host, port, front.model_path,
             front.vocab_size, t.tp, t.dp)
    await asyncio.Event().wait()


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--teacher", default=None, help="the name of the run's teacher (teachers[].name) it serves")


def main(argv: list[str] | None = None) -> None:
    from slimecli.observe.worker import start_worker

    cfg, args = start_worker("python -m slimecli.teacher", argv, __doc__, arguments=_arguments,
                             log_format=f"%(asctime)s teacher[{os.environ.get('RANK', '0')}] %(levelname)s %(message)s")
    if args.teacher is not None:
        from slimecli.config.teachers import find_teacher, teacher_view

        try:
            cfg = teacher_view(cfg, find_teacher(cfg, args.teacher))
        except KeyError as exc:
            sys.exit(f"python -m slimecli.teacher: --teacher {args.teacher}: {exc.args[0]}")
    startup.name(f"teacher rank {os.environ.get('RANK', '0')}")
    startup.mark("imported")
    t = cfg.teacher
    from slimecli.model.loading import set_trust_remote_code

    set_trust_remote_code(cfg.model.trust_remote_code)  # the teacher's loads, weight updates included
    timeout = timedelta(seconds=max(1800.0, t.update_timeout_s + 600, t.warmup_timeout_s + 600))
    if torch.cuda.is_available():  # CUDA tensors (logits) over nccl, control messages over gloo
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("cpu:gloo,cuda:nccl", timeout=timeout)
    else:
        dist.init_process_group("gloo", timeout=timeout)
    layout = make_layout(t.tp, t.dp)
    worker = TeacherWorker(tp=t.tp, tp_rank=layout.tp_rank, group=layout.tp_groups[layout.dp_index],
                           dtype=t.dtype or cfg.model.dtype, sample_chunk_size=t.sample_chunk_size,
                           label_chunk_size=t.label_chunk_size, seed=t.seed + 1009 * layout.dp_index + layout.tp_rank,
                           backend=t.backend, trust_remote_code=cfg.model.trust_remote_code)
    path = teacher_model_path(cfg)
    worker.load(path)
    startup.mark("model loaded")
    if layout.rank == 0:
        asyncio.run(run_front(cfg, Front(cfg, exchanges(layout, worker), worker.vocab_size, path)))
    else:
        serve_peer(layout, worker)


if __name__ == "__main__":
    main()
