"""cluster=slurm: the job settings sbatch would refuse, refused before anything is written or submitted."""

from __future__ import annotations

import re

from slimecli.config.errors import ConfigError
from slimecli.config.schema import SlimeConfig

# SLURM's --time forms: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(:\d{1,2}){0,2})$")


def slurm(cfg: SlimeConfig) -> list[ConfigError]:
    c = cfg.cluster
    errors = []
    if c.time and not TIME.match(c.time):
        errors.append(ConfigError("cluster.time", c.time, "not a SLURM time limit",
                                  "MINUTES, HH:MM:SS or D-HH:MM:SS, e.g. cluster.time=04:00:00"))
    for name in ("partition", "account"):
        value = getattr(c, name)
        if value and not re.fullmatch(r"[\w.,+-]+", value):
            errors.append(ConfigError(f"cluster.{name}", value, "letters, digits and . , + - _ only"))
    for i, line in enumerate(c.sbatch_lines):
        if "\n" in line or "\r" in line or not line.strip():
            errors.append(ConfigError(f"cluster.sbatch_lines[{i}]", line, "one non-empty line per entry"))
    if c.name == "slurm" and c.node_rank != 0:
        errors.append(ConfigError("cluster.node_rank", c.node_rank,
                                  "cluster=slurm submits the whole job; SLURM gives every node its rank"))
    return errors


RULES = [slurm]
