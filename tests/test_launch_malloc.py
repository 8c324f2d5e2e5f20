"""Every process slimecli starts keeps its large freed blocks (launch/child_env.py: malloc_env)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from slimecli.config.compose import load
from slimecli.launch.child_env import MALLOC_ENV, malloc_env
from slimecli.launch.free_ports import with_free_ports
from slimecli.launch.plan import build_plan
from tests.helpers import ROOT
from tests.helpers.teacher import make_checkpoint

# A CPU training step's large temporaries: the log-softmax of [1024, 4096] logits, forward and backward, and the
# entropy beside it. Prints the page faults of 20 steps after a first one.
STEPS = """
import resource, torch
from slimecli.train.losses import entropy_from_logits, log_probs_from_logits
x, t = torch.randn(1024, 4096, requires_grad=True), torch.randint(0, 4096, (1024,))
def step():
    logp = log_probs_from_logits(x, t)
    with torch.no_grad():
        entropy_from_logits(x)
    logp.sum().backward()
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in (*MALLOC_ENV, "GLIBC_TUNABLES", "LD_PRELOAD"):
        monkeypatch.delenv(key, raising=False)


def test_every_planned_process_gets_the_allocator_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    _clean_env(monkeypatch)
    ckpt = make_checkpoint(tmp_path / "teacher", seed=0)
    cfg = load(["teacher=server", f"teacher.model_path={ckpt}", "rollout.num_engines=2"])
    specs = build_plan(with_free_ports(cfg), tmp_path)
    assert [s.name for s in specs] == ["engine-0", "engine-1", "teacher", "trainer"]
    for spec in specs:
        assert {k: spec.env.get(k) for k in MALLOC_ENV} == MALLOC_ENV, spec.name


@pytest.mark.parametrize("key", ["MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES", "LD_PRELOAD"])
def test_the_users_allocator_settings_win(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, key: str):
    _clean_env(monkeypatch)
    monkeypatch.setenv(key, "x" if key != "MALLOC_MMAP_THRESHOLD_" else "1048576")
    assert malloc_env() == {}
    assert all(not (set(MALLOC_ENV) & set(spec.env)) for spec in build_plan(with_free_ports(load([])), tmp_path))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the settings are glibc's")
def test_the_settings_keep_freed_blocks_mapped(monkeypatch: pytest.MonkeyPatch):
    _clean_env(monkeypatch)

    def faults(extra: dict[str, str]) -> int:
        env = {k: v for k, v in os.environ.items() if k not in MALLOC_ENV}
        out = subprocess.run([sys.executable, "-c", STEPS], env={**env, **extra}, capture_output=True, text=True,
                             check=True, cwd=ROOT)
        return int(out.stdout)

    step_pages = 20 * 1024 * 4096 * 4 // os.sysconf("SC_PAGE_SIZE")  # 20 steps of one [1024, 4096] float tensor
    default, kept = faults({}), faults(malloc_env())
    assert default > step_pages  # glibc's own thresholds: the temporaries are faulted in afresh (here 170k)
    assert kept < default / 2.5  # (here 35k)
