"""`slimecli train` with two launched teachers, end to end: each is a process of the plan (teacher-<name>), and
every sample is scored by the teacher its source routes it to, as the dumped samples and each teacher's metrics
show. That the per-teacher KL falls over a longer run is bench/bench_teachers.py's."""

from __future__ import annotations

import json
import math

import pytest

from tests.helpers.teachers import ROUTES, check_routes, make_models, overrides, write_rows
from tests.helpers.train_e2e import metrics, run_train

pytestmark = pytest.mark.slow


def test_two_teachers_each_score_their_own_sources(tmp_path):
    student, low, even = make_models(tmp_path, margin=2.0)
    rows = write_rows(tmp_path / "rows.jsonl")
    args = [a for a in overrides(tmp_path, student, low, even, rows, steps=1) if not a.startswith("run.dir=")]
    run = tmp_path / "run"
    out = run_train(run, *args)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    plan = json.loads((run / "plan.json").read_text())
    names = [p["name"] for p in (plan["processes"] if isinstance(plan, dict) else plan)]
    assert [n for n in names if n.startswith("teacher")] == ["teacher-low", "teacher-even"]
    assert (run / "logs" / "teacher-low.log").is_file() and (run / "logs" / "teacher-even.log").is_file()
    assert check_routes(run) == 64  # every sample of the step, each by its source's teacher
    rows_ = metrics(run)
    assert [r["step"] for r in rows_] == [1]
    for name in ROUTES.values():
        tokens = sum(r[f"teacher/{name}/tokens"] for r in rows_)
        assert tokens > 0, name
        kl = [r[f"teacher/{name}/kl"] for r in rows_ if f"teacher/{name}/kl" in r]
        # a student near uniform over the vocabulary, a teacher leaning +/-2 on half of it: ~1.3 nats
        assert kl and all(math.isfinite(v) and 0.5 < v < 2.5 for v in kl), (name, kl)
