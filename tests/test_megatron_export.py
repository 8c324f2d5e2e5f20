"""trainer=megatron's weight export sends tensor by tensor: the same weights as the whole-stage gather it
replaced, with its largest message one parameter instead of a whole pipeline stage (torchrun, gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # four real ranks under torchrun

pytest.importorskip("megatron.core")

ROOT = Path(__file__).resolve().parent.parent


def test_export_at_tp2_pp2_equals_the_whole_stage_gather_with_bounded_messages(tiny, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node", "4",
            str(ROOT / "tests" / "helpers" / "megatron_export_check.py"), str(tmp_path), str(tiny), "2", "2"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads((tmp_path / "export.json").read_text())
    assert result["names"] == result["old_names"] and "model.layers.1.mlp.down_proj.weight" in result["names"]
    assert result["equal_old"] and result["equal_checkpoint"]
    # one parameter at most; the whole-stage object was larger than any parameter (here about half the model)
    assert result["largest_message"] <= result["largest_parameter"] < result["old_largest_message"]
    assert result["old_largest_message"] > result["total"] / 4
