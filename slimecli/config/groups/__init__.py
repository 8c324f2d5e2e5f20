"""One dataclass per config group; defaults live here and nowhere else."""
