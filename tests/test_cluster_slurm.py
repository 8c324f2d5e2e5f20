"""cluster=slurm: the job script slimecli writes, run for real under a fake srun/scontrol that start the per-node
commands on this machine (2 "nodes" on loopback); sbatch missing or refusing is exit 2."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, free_port
from tests.helpers.train_e2e import metrics

FAKE_SRUN = r"""#!/bin/bash
# srun as slimecli's job uses it: --nodes=N ... CMD; CMD once per "node", SLURM_NODEID set; --kill-on-bad-exit
n=1
while [[ "$1" == --* ]]; do case "$1" in --nodes=*) n="${1#--nodes=}";; esac; shift; done
pids=()
for ((i = 0; i < n; i++)); do
  SLURM_NODEID=$i SLURM_NNODES=$n SLURM_PROCID=$i setsid "$@" > "$FAKE_SRUN_LOGS/node$i.log" 2>&1 &
  pids+=($!)
done
rc=0
for ((i = 0; i < n; i++)); do
  if ! wait -n; then rc=1; for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done; fi
done
exit $rc
"""
FAKE_SCONTROL = """#!/bin/bash
# `scontrol show hostnames LIST`: every node of the fake allocation is this machine
for ((i = 0; i < ${SLURM_NNODES:-1}; i++)); do echo 127.0.0.1; done
"""
FAKE_SBATCH = """#!/bin/bash
echo "$@" > "$FAKE_SBATCH_ARGS"
echo "4242;fakecluster"
"""


def fake_bin(tmp_path: Path, **scripts: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, text in scripts.items():
        path = bin_dir / name
        path.write_text(text)
        path.chmod(0o755)
    return bin_dir


def slimecli(*args: str, path: str, env: dict[str, str] | None = None, timeout: float = 120
             ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slimecli", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PATH": path, **(env or {})}, timeout=timeout)


def no_sbatch_path() -> str:
    return os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                           if not (Path(p) / "sbatch").exists())


def test_dry_run_writes_the_job_and_node_scripts(tmp_path: Path):
    run = tmp_path / "run"
    out = slimecli("train", "--dry-run", "cluster=slurm", "cluster.nnodes=2", "cluster.partition=gpu",
                   "cluster.time=04:00:00", "cluster.gpus_per_node=8", "cluster.account=proj",
                   "cluster.sbatch_lines=[--exclusive,'#SBATCH --qos=high']", "trainer.max_steps=5", f"run.dir={run}",
                   path=no_sbatch_path())
    assert out.returncode == 0, out.stdout + out.stderr
    job = (run / "slurm" / "job.sbatch").read_text()
    lines = job.splitlines()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --partition=gpu", "#SBATCH --time=04:00:00", "#SBATCH --account=proj",
                 "#SBATCH --exclusive", "#SBATCH --qos=high"):
        assert line in lines, line  # whole lines: --nodes=2 is not --nodes=20
    assert any("--kill-on-bad-exit=1" in shlex.split(line) for line in lines if line.startswith("srun")), job
    assert job in out.stdout and "not submitted" in out.stdout
    node = (run / "slurm" / "node.sh").read_text()
    assert "trainer.max_steps=5" in node and 'cluster.node_rank="$SLURM_NODEID"' in node
    assert f"run.dir={run}" in node and "cluster.name=local" in node
    assert not (run / "config.yaml").exists() and not (run / ".lock").exists()  # the nodes make those
    plan = slimecli("plan", "cluster=slurm", "cluster.nnodes=2", f"run.dir={run}", path=no_sbatch_path())
    assert plan.returncode == 0 and "#SBATCH --nodes=2" in plan.stdout.splitlines() and "node.sh" in plan.stdout


def test_slurm_spelling_cluster_nodes(tmp_path: Path):
    """SLURM's word for the node count works as the key; every node then takes it from the allocation."""
    run = tmp_path / "run"
    out = slimecli("train", "--dry-run", "cluster=slurm", "cluster.nodes=4", f"run.dir={run}", path=no_sbatch_path())
    assert out.returncode == 0, out.stdout + out.stderr
    assert "#SBATCH --nodes=4" in (run / "slurm" / "job.sbatch").read_text().splitlines()
    node = (run / "slurm" / "node.sh").read_text()
    assert "cluster.nodes=" not in node and node.count("cluster.nnodes=") == 1 and 'nnodes="$SLURM_NNODES"' in node


def test_missing_or_refusing_sbatch_and_bad_job_settings_are_exit_2(tmp_path: Path):
    out = slimecli("train", "cluster=slurm", f"run.dir={tmp_path / 'a'}", path=no_sbatch_path())
    assert out.returncode == 2, out.stdout + out.stderr
    assert "sbatch is not on PATH" in out.stderr and "--dry-run" in out.stderr and "Traceback" not in out.stderr
    bad = slimecli("train", "cluster=slurm", "cluster.time=soon", "cluster.gpus_per_node=-1", "cluster.tim=1",
                   path=no_sbatch_path())
    assert bad.returncode == 2
    assert "cluster.time" in bad.stderr and "cluster.gpus_per_node" in bad.stderr
    assert "did you mean 'cluster.time'" in bad.stderr
    args_file = tmp_path / "sbatch-args"
    path = f"{fake_bin(tmp_path, sbatch=FAKE_SBATCH)}{os.pathsep}{os.environ['PATH']}"
    ok = slimecli("train", "cluster=slurm", f"run.dir={tmp_path / 'b'}", path=path,
                  env={"FAKE_SBATCH_ARGS": str(args_file)})
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "submitted SLURM job 4242" in ok.stdout
    assert args_file.read_text().split() == ["--parsable", str(tmp_path / "b" / "slurm" / "job.sbatch")]
    refusing = fake_bin(tmp_path / "r", sbatch="#!/bin/bash\necho 'invalid partition specified: gpu' >&2\nexit 1\n")
    no = slimecli("train", "cluster=slurm", f"run.dir={tmp_path / 'c'}", path=f"{refusing}{os.pathsep}{os.environ['PATH']}")
    assert no.returncode == 2 and "invalid partition specified" in no.stderr


@pytest.mark.slow
def test_the_job_trains_on_two_nodes_under_srun(tmp_path: Path):
    run = tmp_path / "run"
    bin_dir = fake_bin(tmp_path, srun=FAKE_SRUN, scontrol=FAKE_SCONTROL)
    written = slimecli("train", "--dry-run", "cluster=slurm", "cluster.nnodes=2", f"cluster.master_port={free_port()}",
                       f"rollout.port={free_port()}", "rollout.engines_per_node=1", "trainer.nproc=1",
                       "trainer.max_steps=3", "eval.at_start=false", "eval.at_end=false", "observe.report=false",
                       f"run.dir={run}", path=no_sbatch_path())
    assert written.returncode == 0, written.stdout + written.stderr
    logs = tmp_path / "srun"
    logs.mkdir()
    job = subprocess.run(["bash", str(run / "slurm" / "job.sbatch")], cwd=tmp_path, capture_output=True, text=True,
                         timeout=600, env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                                           "SLURM_JOB_NODELIST": "fake[1-2]", "SLURM_NNODES": "2",
                                           "FAKE_SRUN_LOGS": str(logs)})
    node_logs = "".join((logs / f"node{i}.log").read_text()[-3000:] for i in (0, 1))
    assert job.returncode == 0, job.stderr + node_logs
    assert [r["step"] for r in metrics(run)] == [1, 2, 3]
    assert (run / "nodes" / "1" / "logs" / "engine-1.log").is_file()  # node 1 served an engine of its own
    assert "cluster.node_rank=1" in (run / "nodes" / "1" / "command.txt").read_text()
