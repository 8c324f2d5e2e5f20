"""teacher=sglang against a real `slimecli rollout serve` engine: prefill-only scoring, end to end.

The SGLang-teacher client asks for input-token log-probs with max_new_tokens 0 (how the reference's
on-policy distillation scores with an SGLang teacher); the engine answers as SGLang does, and the scores are
the tiny model's own log-probs computed with transformers.
"""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from slimecli.config.groups.teacher import TeacherConfig
from slimecli.rollout.sample import Sample
from slimecli.teacher.client import TeacherClient
from tests.helpers.engine import Engine, hf_logprobs
from tests.helpers.train_e2e import metrics, run_train

SAMPLES = [([4, 8, 15, 16, 23, 42], 2), ([42, 7], 1), ([100 + 37 * i for i in range(40)], 17), ([5, 6, 7, 8], 3)]


@pytest.fixture(scope="module")
def hf(engine: Engine) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(str(engine.model_path), attn_implementation="sdpa").eval()


def _score(url: str, samples: list[Sample], temperature: float) -> list[list[float]]:
    cfg = TeacherConfig(name="sglang", url=url, temperature=temperature, max_retries=0)

    async def run() -> list[list[float]]:
        async with TeacherClient(cfg) as client:
            return await client.score(samples)

    return asyncio.run(run())


def test_sglang_teacher_scores_match_transformers(engine: Engine, hf: torch.nn.Module) -> None:
    samples = [Sample(tokens=list(t), response_length=r) for t, r in SAMPLES]
    got = _score(engine.url, samples, 1.0)
    for (tokens, r), scores in zip(SAMPLES, got, strict=True):
        want = hf_logprobs(hf, tokens[:-r], tokens[-r:], 1.0)
        assert len(scores) == r
        assert scores == pytest.approx(want, abs=1e-4)


def test_sglang_teacher_refuses_a_temperature_sglang_would_not_apply() -> None:
    """SGLang's input-token log-probs are at temperature 1 whatever the request says: refused, not mis-scored."""
    from slimecli.config.compose import load
    from slimecli.config.errors import ConfigErrors

    with pytest.raises(ValueError, match="temperature 1 only"):
        TeacherClient(TeacherConfig(name="sglang", url="http://127.0.0.1:9", temperature=0.7))
    with pytest.raises(ConfigErrors) as exc:
        load(["+recipe=opd", "teacher=sglang", "teacher.url=http://127.0.0.1:9", "rollout.temperature=0.7"])
    assert "rollout.temperature" in str(exc.value) and "teacher=server" in str(exc.value)
    assert load(["+recipe=opd", "teacher=sglang", "teacher.url=http://127.0.0.1:9"]).rollout.temperature == 1.0


def test_many_concurrent_scores(engine: Engine, hf: torch.nn.Module) -> None:
    """More samples than the client's concurrency, scored while the engine also serves each other."""
    samples = [Sample(tokens=[(7 * i + 3 * j) % 3000 + 1 for j in range(12 + i % 5)], response_length=1 + i % 4)
               for i in range(20)]
    got = _score(engine.url, samples, 1.0)
    for s, scores in zip(samples, got, strict=True):
        r = s.response_length
        assert scores == pytest.approx(hf_logprobs(hf, s.tokens[:-r], s.tokens[-r:], 1.0), abs=1e-4)


@pytest.mark.parametrize("start", [0, 1, 4])
def test_prefill_only_reply(engine: Engine, hf: torch.nn.Module, start: int) -> None:
    tokens = [11, 22, 33, 44, 55, 66]
    out = engine.generate(input_ids=tokens, return_logprob=True, logprob_start_len=start,
                          sampling_params={"max_new_tokens": 0})
    meta = out["meta_info"]
    assert out["output_ids"] == [] and out["text"] == ""
    assert meta["completion_tokens"] == 0 and meta["finish_reason"] == {"type": "length", "length": 0}
    assert meta["output_token_logprobs"] == [] and meta["prompt_tokens"] == len(tokens)
    entries = meta["input_token_logprobs"]
    assert [e[1] for e in entries] == tokens[start:] and all(e[2] is None for e in entries)
    assert entries[0][0] is None  # SGLang: nothing before the first returned position is scored
    want = hf_logprobs(hf, tokens[:start + 1], tokens[start + 1:], 1.0)
    assert [e[0] for e in entries[1:]] == pytest.approx(want, abs=1e-4)
    plain = engine.generate(input_ids=tokens, sampling_params={"max_new_tokens": 0}, return_logprob=True)
    assert plain["meta_info"]["input_token_logprobs"] == []  # no logprob_start_len: no input log-probs


@pytest.mark.slow
def test_opd_trains_with_an_sglang_teacher(engine: Engine, tmp_path) -> None:
    """`slimecli train +recipe=opd teacher=sglang` against a real `slimecli rollout serve`, end to end.

    The student starts from the very checkpoint the engine serves as teacher, so before the first update its
    own rollout log-probs and the teacher's prefill scores of the same tokens must agree: a gap of ~0 at step 1
    with a teacher mean near -log(vocab) shows the scores are real and aligned token by token (zeros, scores
    shifted by one token or taken at another temperature would not). Once the student is trained the two models
    differ: the gap moves.
    """
    run = tmp_path / "opd"
    out = run_train(run, "+recipe=opd", "teacher=sglang", f"teacher.url={engine.url}",
                    f"model.path={engine.model_path}", "trainer.nproc=1", "trainer.max_steps=3",
                    "trainer.save_interval=0", "eval.at_start=false", "eval.at_end=false", "observe.report=false")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    teacher = [r["opd/teacher_logp_mean"] for r in rows]
    gaps = [r["opd/student_teacher_gap"] for r in rows]
    assert all(math.isfinite(v) for v in teacher + gaps), (teacher, gaps)
    assert all(-12.0 < t < -1.0 for t in teacher), teacher  # the tiny model's vocabulary is 4096: ln 4096 = 8.3
    # the same weights: the student's own log-probs (seen: ~4e-8; scores shifted by one token give ~1e-2)
    assert abs(gaps[0]) < 1e-5, gaps
    assert max(abs(g) for g in gaps[1:]) > 1e-3, gaps  # updated once, the student is another model (seen: ~1e-2)
    assert all(r["reward/mean"] is not None for r in rows)  # the task reward is still computed (reward_coef 0)
