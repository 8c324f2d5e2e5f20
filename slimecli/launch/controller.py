"""The controller behind `slimecli train`: resolve, write the run dir, launch the plan, supervise."""

from __future__ import annotations

from rich.console import Console

from slimecli.config.schema import SlimeConfig
from slimecli.launch.plan import build_plan
from slimecli.launch.preflight import check, materialize
from slimecli.launch.rundir import prepare, write_plan
from slimecli.launch.supervisor import Supervisor


def run(cfg: SlimeConfig, argv: list[str], overrides: list[str], console: Console | None = None) -> int:
    console = console or Console(highlight=False, soft_wrap=True)
    cfg = materialize(cfg)
    check(cfg)
    run_dir = prepare(cfg, argv, overrides)
    if run_dir.resumed:
        console.print(f"[bold]resuming[/] the run in {run_dir.path}")
        for line in run_dir.changed:
            console.print(f"  [yellow]config changed[/] {line}")
    else:
        console.print(f"[bold]run directory[/] {run_dir.path}")
    specs = build_plan(cfg, run_dir.path)
    write_plan(run_dir, specs)
    return Supervisor(specs, run_dir.log_dir, console=console).run()
