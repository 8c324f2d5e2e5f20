"""`slimecli train`: compose, validate, then launch and supervise engines, teacher and trainer; at the end, write
the run's report (observe.report) and print its path."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from slimecli.cli.common import OVERRIDES, RecipeDirOption, fail, load_config_or_exit, split_overrides

if TYPE_CHECKING:
    from rich.console import Console

    from slimecli.config.schema import SlimeConfig
    from slimecli.observe.follow import MetricsFollower
    from slimecli.observe.startup import ProcessStartup


def register(app: typer.Typer) -> None:
    @app.command("train", context_settings=OVERRIDES, epilog="""[bold]Examples[/]

  slimecli train                                   # embedded quickstart: tiny model, CPU, minutes

  slimecli train optimizer=stateless_adam trainer.max_steps=20

  slimecli train run.dir=runs/mine                 # run again with the same run.dir to resume

  slimecli train +recipe=opd teacher=server teacher.url=http://127.0.0.1:7999""")
    def train(ctx: typer.Context, recipe_dir: list[str] = RecipeDirOption,
              dry_run: bool = typer.Option(False, "--dry-run", help="cluster=slurm: write and print the sbatch "
                                           "script, do not submit it."),
              verbose: bool = typer.Option(False, "--verbose", help="Stream every line of every process to the "
                                           "console (observe.verbose=true); by default library noise is left "
                                           "to RUN/logs/."),
              profile_startup: bool = typer.Option(False, "--profile-startup", help="At the end, print where each "
                                                   "process's start-up went: imports, model load, ready, first step "
                                                   "(from RUN/logs/startup.jsonl).")) -> None:
        """Train: rollout engines and teacher start first, then the trainer under torchrun."""
        import time

        from rich.console import Console

        from slimecli.config.errors import ConfigErrors
        from slimecli.launch.controller import run
        from slimecli.observe import startup

        started, started_at = time.monotonic(), time.time()
        controller = startup.ProcessStartup("controller", startup.process_started())
        if profile_startup:
            os.environ[startup.STARTUP_ENV] = "1"  # inherited by every process the run starts
            controller.phases["imported"] = (time.time(), _cpu_s())
        overrides = split_overrides(ctx.args) + (["observe.verbose=true"] if verbose else [])
        cfg = load_config_or_exit(overrides, recipe_dir, resume=True)
        controller.phases["ready"] = (time.time(), _cpu_s())  # composed and checked: what the run starts from
        console = Console(highlight=False, soft_wrap=True)
        if cfg.cluster.name == "slurm":
            _submit_slurm(cfg, overrides, recipe_dir, dry_run, console)
            return
        if dry_run:
            fail("--dry-run writes a cluster=slurm job script; `slimecli plan` shows what a local run starts")
        follower = _start_progress(cfg, console)
        complete_already: list[bool] = []  # nothing trained: the summary's wall time is the run's own
        try:
            code = run(cfg, sys.argv, overrides, console=console, on_complete=lambda: complete_already.append(True))
        except ConfigErrors as exc:  # checks that need the model files
            fail(exc.render())
        finally:
            if follower is not None:
                follower.stop()
        if profile_startup:
            _startup_table(cfg, console, controller)
        if cfg.observe.report and cfg.cluster.node_rank == 0:  # the first node reports for every node
            _report(cfg, console)
        if cfg.cluster.node_rank == 0:
            command_s = None if complete_already else time.monotonic() - started
            _summary(cfg, console, command_s, started_at, split_overrides(ctx.args))
        raise typer.Exit(code)


def _cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def _startup_table(cfg: SlimeConfig, console: Console, controller: ProcessStartup) -> None:
    """--profile-startup: when each process started and reached each phase (RUN/logs/startup.jsonl)."""
    from rich.markup import escape

    from slimecli.observe import startup

    run_dir = own_run_dir(cfg)
    found = startup.read(run_dir / "logs" / startup.STARTUP_FILE) if run_dir is not None else []
    console.print("[bold]start-up[/] (seconds since the command started; CPU-seconds of each process in brackets; "
                  "the controller's ready: its config composed and checked)")
    for line in startup.table([controller, *found], controller.started):
        console.print(escape(line))


def _submit_slurm(cfg: SlimeConfig, overrides: list[str], recipe_dirs: list[str], dry_run: bool,
                  console: Console) -> None:
    """cluster=slurm: RUN/slurm/job.sbatch running this same command on every node, then sbatch (exit 2 where
    sbatch is missing or refuses)."""
    from slimecli.config.errors import ConfigErrors
    from slimecli.launch.preflight import materialize, model_errors
    from slimecli.launch.rundir import create
    from slimecli.launch.slurm import submit, write_job

    try:
        # the model files, seen from here (a shared file system); each node checks its own machine when it starts
        errors = model_errors(materialize(cfg))
        if errors:
            raise ConfigErrors(errors)
        job = write_job(cfg, create(cfg), overrides, recipe_dirs, Path.cwd())
        if dry_run:
            console.print(job.read_text(), markup=False, highlight=False)
            console.print(f"[bold]written[/] {job} (and node.sh next to it); not submitted (--dry-run)")
            return
        job_id = submit(job)
    except ConfigErrors as exc:
        fail(exc.render())
    console.print(f"[bold]submitted[/] SLURM job {job_id}: {job}; its output goes to {job.parent}/{job_id}.out")


def own_run_dir(cfg: SlimeConfig) -> Path | None:
    """The run directory this process works in: run.dir, or the auto-named one whose lock holds our pid (the
    lock stays until this process exits)."""
    if cfg.run.dir:
        path = Path(cfg.run.dir).expanduser().resolve()
        return path if path.is_dir() else None
    root = Path(cfg.run.root).expanduser()
    for lock in sorted(root.glob(f"{cfg.run.name}-*/.lock"), reverse=True) if root.is_dir() else []:
        try:
            owner = json.loads(lock.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(owner, dict) and owner.get("pid") == os.getpid() and owner.get("host") == socket.gethostname():
            return lock.parent.resolve()
    return None


def _start_progress(cfg: SlimeConfig, console: Console) -> MetricsFollower | None:
    """On a terminal (and not observe.verbose), the controller draws the progress bar from RUN/metrics.jsonl."""
    if not console.is_terminal or cfg.observe.verbose:
        return None
    from slimecli.observe.follow import MetricsFollower
    from slimecli.observe.progress import PROGRESS_ENV

    os.environ[PROGRESS_ENV] = "controller"  # inherited by the children: the trainer prints no step lines
    return MetricsFollower(console, cfg.trainer.max_steps, lambda: own_run_dir(cfg)).start()


def _summary(cfg: SlimeConfig, console: Console, command_s: float | None, started_at: float,
             overrides: list[str]) -> None:
    """What the run achieved, where its results are and how to resume or continue it (observe.summary); never
    fails the run. ``command_s``: this command's seconds, since ``started_at`` (None: it trained nothing, the
    wall time is what the run's metrics recorded)."""
    run_dir = own_run_dir(cfg)
    if run_dir is None:
        return
    from rich.markup import escape

    from slimecli.launch.rundir import resume_command
    from slimecli.observe.summary import render, summarize

    try:
        summary = summarize(run_dir, command_s, started_at)
        lines = render(summary, resume_command(run_dir, overrides, summary.more_steps()))
    except Exception as exc:  # noqa: BLE001 - the run is over; its files say the same
        console.print(f"[yellow]no run summary: {type(exc).__name__}: {escape(str(exc))}[/]")
        return
    console.print(f"[bold]{escape(lines[0])}[/]")
    for line in lines[1:]:
        console.print(escape(line))


def _report(cfg: SlimeConfig, console: Console) -> None:
    """RUN/report/report.html of the run that just ended (a run with no metrics has none); never fails the run."""
    from slimecli.observe.metrics import read_metrics

    run_dir = own_run_dir(cfg)
    if run_dir is None or not read_metrics(run_dir):
        return
    try:
        from slimecli.observe.report import write_report

        page = write_report([run_dir])
    except KeyboardInterrupt:  # a second Ctrl-C while the report is drawn
        console.print(f"[yellow]report skipped[/] (slimecli report {run_dir})")
        return
    except Exception as exc:  # noqa: BLE001 - the run is over and its metrics are safe; say why, keep its code
        console.print(f"[yellow]report not written: {type(exc).__name__}: {exc}[/] (slimecli report {run_dir})")
        return
    console.print(f"[bold]report[/] {page}")
