"""Ports picked at launch: each server port left "auto" becomes a free port of this machine.

Every process of a run reads its ports from RUN/config.yaml (engine k on rollout.port + k, the teacher on
teacher.port), so the picked ports are written there and into RUN/plan.json before anything starts. The
engines get one block of consecutive ports: the layout numbers them from one base port, and the trainer finds
them the same way. A multi-node run keeps "auto": it means the agreed port there (config/layout.py),
which every node computes alike. agent.port stays "auto": the adapter binds any free port itself and reports it.
"""

from __future__ import annotations

from dataclasses import replace

from slimecli.config.errors import ConfigError, ConfigErrors
from slimecli.config.layout import embedded_judge, engine_count, teacher_nodes
from slimecli.config.port import is_auto
from slimecli.config.schema import SlimeConfig
from slimecli.config.teachers import run_teachers, teacher_view, with_teacher_settings
from slimecli.net.ports import free_port, free_ports


def with_free_ports(cfg: SlimeConfig) -> SlimeConfig:
    """The run's engines' and launched teachers' "auto" ports picked (`slimecli train`, `slimecli plan`)."""
    return with_free_judge_port(with_free_teacher_ports(with_free_rollout_port(cfg)))


def with_free_teacher_ports(cfg: SlimeConfig) -> SlimeConfig:
    """Each launched teacher's "auto" port picked (config/teachers.py), no two alike."""
    taken: set[int] = set()
    for teacher in run_teachers(cfg):
        view = teacher_view(cfg, teacher)
        for _ in range(8):  # the OS may hand out a port twice in a row
            picked = with_free_teacher_port(view).teacher
            if picked is view.teacher or picked.port not in taken:
                break
        if isinstance(picked.port, int):
            taken.add(picked.port)
        if picked is not view.teacher:
            cfg = with_teacher_settings(cfg, teacher, picked)
    return cfg


def with_free_rollout_port(cfg: SlimeConfig, engines: int | None = None) -> SlimeConfig:
    """rollout.port "auto" -> the first of ``engines`` (default: the run's engines) consecutive free ports."""
    r = cfg.rollout
    if not is_auto(r.port) or cfg.cluster.nnodes > 1:  # multi-node: the agreed port (config/layout.py)
        return cfg
    block = max(engine_count(cfg) if engines is None else engines, 1)
    return replace(cfg, rollout=replace(r, port=_pick("rollout.port", "rollout.host", r.host, block)))


def with_free_teacher_port(cfg: SlimeConfig) -> SlimeConfig:
    """teacher.port "auto" -> a free port, when the config launches a teacher server (else nothing listens)."""
    t = cfg.teacher
    if not (is_auto(t.port) and teacher_nodes(cfg)) or cfg.cluster.nnodes > 1:
        return cfg
    return replace(cfg, teacher=replace(t, port=_pick("teacher.port", "teacher.host", t.host)))


def with_free_judge_port(cfg: SlimeConfig) -> SlimeConfig:
    """reward.judge_port "auto" -> a free port, when the run starts an embedded judge (layout.embedded_judge)."""
    r = cfg.reward
    if not is_auto(r.judge_port) or embedded_judge(cfg) is None:
        return cfg
    return replace(cfg, reward=replace(r, judge_port=_pick("reward.judge_port", "reward.judge_host", r.judge_host)))


def _pick(key: str, host_key: str, host: str, block: int | None = None) -> int:
    """A free port on ``host`` (``block``: the first of that many consecutive ones); exit 2 naming ``key`` where
    there is none (a host this machine cannot listen on, or no free block left)."""
    try:
        return free_port(host) if block is None else free_ports(host, block)
    except OSError as exc:
        raise _cannot_pick(key, host_key, exc) from None


def _cannot_pick(key: str, host_key: str, exc: OSError) -> ConfigErrors:
    return ConfigErrors([ConfigError(key, "auto", f"cannot pick a free port: {exc}",
                                     f"check {host_key}, or set {key} to a free port")])
