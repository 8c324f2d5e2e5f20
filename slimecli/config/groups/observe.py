from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ObserveConfig:
    """What a run shows besides RUN/metrics.jsonl and TensorBoard (the log level is run.log_level)."""

    report: bool = True  # write RUN/report/ (plots + report.html) when `slimecli train` ends
    wandb: bool = False  # also log every metric to Weights & Biases (pip install 'slimecli[wandb]')
    wandb_project: str = "slimecli"
    wandb_run_name: str | None = None  # None: the run directory's name
    # false: the console shows the controller's progress bar and the children's warnings; every line of every
    # child is in RUN/logs/<name>.log either way. true: every child line is streamed to the console too.
    verbose: bool = False
