"""cluster=slurm: an sbatch script that runs the same `slimecli train` on every node of the allocation.

The script asks SLURM for the nodes, takes the first one as torchrun's master and every node's address as
cluster.node_hosts, and starts one controller per node through srun; each reads its node rank from
SLURM_NODEID. Every node works in one run directory (a shared file system), created by the submitting
command, so the same job submitted again resumes the run. srun's --kill-on-bad-exit ends every node when one
fails.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from slimecli.config.errors import NO_VALUE, ConfigError, ConfigErrors
from slimecli.config.schema import SlimeConfig

SLURM_DIR = "slurm"  # RUN/slurm/: the job script, the per-node command, SLURM's own output
# what every node's command sets itself from the allocation, after the submitted overrides
NODE_OVERRIDES = ('cluster.name=local', 'cluster.nnodes="$SLURM_NNODES"', 'cluster.node_rank="$SLURM_NODEID"',
                  'cluster.master_addr="$SLIMECLI_MASTER_ADDR"', '"cluster.node_hosts=[$SLIMECLI_NODE_HOSTS]"')


def sbatch_script(cfg: SlimeConfig, run_dir: Path) -> str:
    """The job script; it runs RUN/slurm/node.sh once on every node."""
    c = cfg.cluster
    slurm_dir = run_dir / SLURM_DIR
    lines = ["#!/bin/bash", f"#SBATCH --job-name={cfg.run.name}", f"#SBATCH --nodes={c.nnodes}",
             "#SBATCH --ntasks-per-node=1", f"#SBATCH --output={slurm_dir}/%j.out"]
    if c.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={c.gpus_per_node}")
    for flag, value in (("partition", c.partition), ("time", c.time), ("account", c.account)):
        if value:
            lines.append(f"#SBATCH --{flag}={value}")
    lines += [line if line.startswith("#SBATCH") else f"#SBATCH {line}" for line in c.sbatch_lines]
    lines += [
        f"# written by slimecli for the run {run_dir}",
        "set -euo pipefail",
        'hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        'export SLIMECLI_MASTER_ADDR=$(printf "%s\\n" $hosts | head -n 1)',
        'export SLIMECLI_NODE_HOSTS=$(printf "%s\\n" $hosts | paste -sd, -)',
        f"srun --nodes={c.nnodes} --ntasks-per-node=1 --kill-on-bad-exit=1 bash {shlex.quote(str(slurm_dir / 'node.sh'))}",
        "",
    ]
    return "\n".join(lines)


def node_script(cfg: SlimeConfig, run_dir: Path, overrides: list[str], recipe_dirs: list[str], workdir: Path) -> str:
    """One node's `slimecli train`: the submitted overrides, this node's place in the allocation, the run dir."""
    mine = ("run.dir=", "cluster.name=", "cluster.node_rank=", "cluster.nnodes=", "cluster.nodes=")  # NODE_OVERRIDES
    kept = [o for o in overrides if not o.lstrip("+~").startswith(mine)]
    argv = [sys.executable, "-m", "slimecli", "train", *(f"--recipe-dir={d}" for d in recipe_dirs), *kept]
    command = " ".join([*map(shlex.quote, argv), *NODE_OVERRIDES, shlex.quote(f"run.dir={run_dir}")])
    return "\n".join(["#!/bin/bash", "# one node of the slimecli job (srun starts it once per node)",
                      f"cd {shlex.quote(str(workdir))}", f"exec {command}", ""])


def write_job(cfg: SlimeConfig, run_dir: Path, overrides: list[str], recipe_dirs: list[str],
              workdir: Path) -> Path:
    """RUN/slurm/job.sbatch and node.sh; the job script's path."""
    slurm_dir = run_dir / SLURM_DIR
    slurm_dir.mkdir(parents=True, exist_ok=True)
    (slurm_dir / "node.sh").write_text(node_script(cfg, run_dir, overrides, recipe_dirs, workdir))
    job = slurm_dir / "job.sbatch"
    job.write_text(sbatch_script(cfg, run_dir))
    return job


def submit(job: Path) -> str:
    """sbatch the job; its job id. ConfigErrors (exit 2) when sbatch is missing or refuses the job."""
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise ConfigErrors([ConfigError("cluster.name", "slurm", "sbatch is not on PATH: this machine cannot submit "
                                        "SLURM jobs", f"run it where SLURM is, or pass --dry-run to only write {job}")])
    out = subprocess.run([sbatch, "--parsable", str(job)], capture_output=True, text=True)
    if out.returncode != 0:
        raise ConfigErrors([ConfigError(str(job), NO_VALUE, f"sbatch refused the job: {out.stderr.strip()}",
                                        "check cluster.partition, cluster.account, cluster.time")])
    return out.stdout.strip().split(";")[0]
