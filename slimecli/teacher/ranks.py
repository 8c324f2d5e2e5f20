"""Process roles of the teacher server under torchrun: tp x dp ranks, DP group d = ranks [d*tp, (d+1)*tp).

Global rank 0 runs the HTTP front and is also the leader of DP group 0. The leader of every other group
talks to rank 0 over a two-rank link group; leaders broadcast each message to their TP peers, and every
rank of the group runs it (the TP collectives inside). Messages are small dicts:
{"op": "score", ...} | {"op": "load", "path"} | {"op": "noop"} (keep-alive) | {"op": "stop"}.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from slimecli.teacher.worker import RequestInvalid, TeacherWorker

log = logging.getLogger("slimecli.teacher")

Exchange = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass
class Layout:
    rank: int
    tp: int
    dp: int
    tp_groups: list[Any]  # one process group per DP group (every rank creates all of them, in order)
    links: list[Any]  # links[d]: the {0, leader d} group; links[0] is None

    @property
    def dp_index(self) -> int:
        return self.rank // self.tp

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    def leader(self, d: int) -> int:
        return d * self.tp


def make_layout(tp: int, dp: int) -> Layout:
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != tp * dp:
        raise SystemExit(f"teacher: torchrun started {world} ranks but teacher.tp x teacher.dp = {tp} x {dp}")
    tp_groups = [dist.new_group(list(range(d * tp, (d + 1) * tp))) for d in range(dp)]
    links = [None] + [dist.new_group([0, d * tp]) for d in range(1, dp)]
    return Layout(rank, tp, dp, tp_groups, links)


def handle(worker: TeacherWorker, msg: dict[str, Any]) -> dict[str, Any]:
    op = msg.get("op")
    if msg.get("delay_s"):  # test hook (see protocol.TEST_HOOKS_ENV): every rank of the group waits alike
        time.sleep(msg["delay_s"])
    try:
        if op == "score":
            fault = msg.get("fault")  # test hook (protocol.TEST_HOOKS_ENV): [tp_rank, stage]
            fail_at = fault[1] if fault and fault[0] == worker.tp_rank else None
            return {"ok": True, "result": worker.score(msg["input_ids"], msg["sample_n"], msg["labels"],
                                                       msg["temperature"], fail_at)}
        if op == "load":
            worker.load(msg["path"])
            return {"ok": True, "vocab_size": worker.vocab_size}
        if op == "noop":
            return {"ok": True}
        return {"ok": False, "error": f"unknown op {op!r}"}
    except RequestInvalid as exc:  # every rank of the group raised it, before any collective
        return {"ok": False, "status": 400, "error": str(exc)}
    except Exception as exc:  # reported to the front as a failed request
        if worker.in_collective:  # the TP peers are inside a collective this rank will never join
            log.critical("teacher rank failed inside a TP collective on %s: %s; stopping so that the group does "
                         "not hang", op, exc, exc_info=True)
            logging.shutdown()
            os._exit(70)
        log.exception("teacher rank failed on %s", op)
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


def _bcast(obj: Any, src: int, group: Any) -> Any:
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


def exchanges(layout: Layout, worker: TeacherWorker) -> list[Exchange]:
    """On rank 0: one blocking send-and-wait function per DP group (call each from one thread only)."""

    def local(msg: dict[str, Any]) -> dict[str, Any]:
        if layout.tp > 1:
            _bcast(msg, 0, layout.tp_groups[0])
        return handle(worker, msg)

    def remote(d: int) -> Exchange:
        def send(msg: dict[str, Any]) -> dict[str, Any]:
            _bcast(msg, 0, layout.links[d])
            return _bcast(None, layout.leader(d), layout.links[d])
        return send

    return [local] + [remote(d) for d in range(1, layout.dp)]


def serve_peer(layout: Layout, worker: TeacherWorker) -> None:
    """Every rank but 0: leaders relay rank 0's messages to their group and answer; followers just run."""
    d, leader = layout.dp_index, layout.leader(layout.dp_index)
    group = layout.tp_groups[d]
    while True:
        if layout.tp_rank == 0:
            msg = _bcast(None, 0, layout.links[d])
            if layout.tp > 1:
                _bcast(msg, leader, group)
        else:
            msg = _bcast(None, leader, group)
        if msg.get("op") == "stop":
            return
        reply = handle(worker, msg)
        if layout.tp_rank == 0:
            _bcast(reply, leader, layout.links[d])
