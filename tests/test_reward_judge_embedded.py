"""reward=judge with the embedded engine as the judge, end to end: `slimecli eval` of the quickstart's held-out
set starts the judge beside the rollout engine (planned and supervised like it), and with the verdict grammar on
every verdict the tiny random model gives parses."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.slow  # starts two engines and an evaluator


def test_quickstart_eval_with_the_embedded_judge_has_no_unparsed_verdicts(tmp_path):
    datasets = "eval.datasets=[{name:heldout,task:quickstart,n_samples_per_prompt:2,reward:{name:judge}}]"
    out = subprocess.run([sys.executable, "-m", "slimecli", "eval", "reward=judge", datasets,
                          f"run.root={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "judge is ready" in out.stdout and "judge_errors" in out.stdout
    assert re.search(r"judge \| slimecli engine ready on http://127\.0\.0\.1:\d+ \(model .*tiny", out.stdout)
    (run,) = tmp_path.iterdir()
    plan = json.loads((run / "plan.json").read_text())
    names = [p["name"] for p in plan]
    assert names.index("judge") < names.index("evaluator")  # a server, started and probed before the evaluator
    summary = json.loads((run / "eval" / "step_0" / "summary.json").read_text())
    metrics = summary["datasets"][0]["metrics"]
    assert metrics["judge_calls"] == 32 and metrics["judge_errors"] == 0 and metrics["invalid"] == 0
    rows = [json.loads(line) for line in (run / "eval" / "step_0" / "heldout.jsonl").read_text().splitlines()]
    assert len(rows) == 32
    for row in rows:  # the grammar made every reply the verdict itself
        assert re.fullmatch("PASS|FAIL", row["judge"]["verdict"]), row
        assert row["value"] == (1.0 if row["judge"]["verdict"] == "PASS" else 0.0)
