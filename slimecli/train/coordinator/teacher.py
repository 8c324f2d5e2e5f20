"""Rank 0's teacher scoring (on-policy distillation): the teacher servers' log-probs of every sampled token."""

from __future__ import annotations

from slimecli.config.schema import SlimeConfig
from slimecli.rollout.collect import RolloutResult


class TeacherScoring:
    def __init__(self, cfg: SlimeConfig) -> None:
        from slimecli.config.layout import teacher_urls
        from slimecli.teacher.client import TeacherPool

        # the teacher servers (one, or one per node) score the student's tokens at the rollout temperature
        self.pool = TeacherPool(cfg.teacher, teacher_urls(cfg), temperature=cfg.rollout.temperature)

    async def score(self, result: RolloutResult) -> dict[str, float]:
        """Each sample's teacher_log_probs, and the batch's opd/* metrics."""
        scores = await self.pool.score(result.samples)
        gaps, teacher_means = [], []
        for sample, teacher_lp in zip(result.samples, scores, strict=True):
            sample.teacher_log_probs = list(teacher_lp)
            mask = sample.effective_loss_mask()
            student = sample.rollout_log_probs or [0.0] * sample.response_length
            n = sum(mask)
            if n:
                teacher_means.append(sum(t * m for t, m in zip(teacher_lp, mask, strict=True)) / n)
                gaps.append(sum((s - t) * m for s, t, m in zip(student, teacher_lp, mask, strict=True)) / n)
        return {"opd/teacher_logp_mean": _mean(teacher_means), "opd/student_teacher_gap": _mean(gaps)}

    async def close(self) -> None:
        await self.pool.close()


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
