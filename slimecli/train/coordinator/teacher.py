"""Rank 0's teacher scoring (on-policy distillation): each sample goes to its teacher (config/teachers.py: routed
by its source label), which scores every sampled token; the batch's opd/* metrics and each teacher's own
teacher/<name>/{kl,tokens,latency_s}."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from slimecli.config.schema import SlimeConfig
from slimecli.config.teachers import route, run_teachers, teacher_view
from slimecli.rollout.collect import RolloutResult
from slimecli.rollout.sample import Sample

log = logging.getLogger("slimecli.train")


class TeacherRefused(RuntimeError):
    """A teacher the run cannot distil from (another vocabulary): the run stops before its first step."""


class TeacherScoring:
    def __init__(self, cfg: SlimeConfig) -> None:
        from slimecli.config.layout import teacher_urls
        from slimecli.teacher.client import TeacherPool

        self.cfg = cfg
        self.teachers = run_teachers(cfg)
        # each teacher's servers (one, or one per node) score the student's tokens at the rollout temperature
        self.pools = {}
        for t in self.teachers:
            view = teacher_view(cfg, t)
            self.pools[t.name] = TeacherPool(view.teacher, teacher_urls(view), temperature=cfg.rollout.temperature)

    async def check(self, tokenizer: Any) -> None:
        """Refuse a teacher that runs already (a url) whose vocabulary is not the student's; a launched one was
        checked from its files before it started."""
        from slimecli.teacher.vocab_check import vocabulary_problem

        m = self.cfg.model
        for t in self.teachers:
            if not t.settings.url:
                continue
            client = self.pools[t.name].clients[0]
            problem = await vocabulary_problem(client, m.resolved_path, m.resolved_tokenizer_path, tokenizer)
            if problem:
                raise TeacherRefused(f"teacher {t.name} ({t.key}.url={client.url}) cannot teach this student: "
                                     f"{problem}")

    async def score(self, result: RolloutResult) -> dict[str, float]:
        """Each sample's teacher and teacher_log_probs, and the batch's opd/* and teacher/<name>/* metrics."""
        routed: dict[str, list[Sample]] = {t.name: [] for t in self.teachers}
        for sample in result.samples:
            sample.teacher = route(self.cfg, sample.metadata.get("source"))
            routed[sample.teacher].append(sample)
        per_teacher = await asyncio.gather(*(self._score_with(name, samples) for name, samples in routed.items()))
        metrics: dict[str, float] = {k: v for part in per_teacher for k, v in part.items()}
        gaps, teacher_means = [], []
        for sample in result.samples:
            teacher_lp = sample.teacher_log_probs or []
            mask = sample.effective_loss_mask()
            student = sample.rollout_log_probs or [0.0] * sample.response_length
            n = sum(mask)
            if n:
                teacher_means.append(sum(t * m for t, m in zip(teacher_lp, mask, strict=True)) / n)
                gaps.append(sum((s - t) * m for s, t, m in zip(student, teacher_lp, mask, strict=True)) / n)
        return {"opd/teacher_logp_mean": _mean(teacher_means), "opd/student_teacher_gap": _mean(gaps), **metrics}

    async def _score_with(self, name: str, samples: list[Sample]) -> dict[str, float]:
        """One teacher's samples scored; its KL (the student's minus the teacher's log-prob per trained token, the
        k1 estimate of KL(student || teacher)), its trained tokens and how long it took."""
        if not samples:
            return {f"teacher/{name}/tokens": 0.0}
        started = time.perf_counter()
        scores = await self.pools[name].score(samples)
        latency = time.perf_counter() - started
        total, tokens = 0.0, 0
        for sample, teacher_lp in zip(samples, scores, strict=True):
            sample.teacher_log_probs = list(teacher_lp)
            student = sample.rollout_log_probs or [0.0] * sample.response_length
            for s, t, m in zip(student, teacher_lp, sample.effective_loss_mask(), strict=True):
                if m:
                    total, tokens = total + s - t, tokens + 1
        out = {f"teacher/{name}/tokens": float(tokens), f"teacher/{name}/latency_s": latency}
        if tokens:
            out[f"teacher/{name}/kl"] = total / tokens
        return out

    async def close(self) -> None:
        for pool in self.pools.values():
            await pool.close()


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
