"""The controller behind `slimecli train`: resolve, write the run dir, launch the plan, supervise."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from slimecli.config.errors import NO_VALUE, ConfigError, ConfigErrors
from slimecli.config.layout import run_dir_of
from slimecli.config.schema import SlimeConfig
from slimecli.launch.agent_checks import say_sandbox_notice
from slimecli.launch.free_ports import with_free_ports
from slimecli.launch.plan import build_plan
from slimecli.launch.preflight import check, materialize
from slimecli.launch.rundir import prepare, resume_command, write_plan
from slimecli.launch.stall import StallWatch
from slimecli.launch.supervisor import Supervisor
from slimecli.observe.metrics import METRICS_FILE
from slimecli.observe.restarts import RESTARTS_FILE
from slimecli.process import RESTART_ENV


def run(cfg: SlimeConfig, argv: list[str], overrides: list[str], console: Console | None = None,
        on_complete: Callable[[], None] | None = None) -> int:
    """Exit code of the run; ``on_complete`` is called when the run was complete already and nothing started
    (its summary then reports the run's recorded wall time, not this command's few seconds)."""
    console = console or Console(highlight=False, soft_wrap=True)
    cfg = with_free_ports(materialize(cfg))  # "auto" ports: free ones now, written to config.yaml and plan.json
    check(cfg)
    say_sandbox_notice(cfg, console)
    run_dir = prepare(cfg, argv, overrides)
    if run_dir.resumed:
        console.print(f"[bold]resuming[/] the run in {run_dir.path}")
        for line in run_dir.changed:
            console.print(f"  [yellow]config changed[/] {line}")
    else:
        console.print(f"[bold]run directory[/] {run_dir.path}")
    shared = run_dir_of(run_dir.config_path)  # node ranks > 0 work in RUN/nodes/<rank>; the command names RUN
    console.print(f"[bold]resume:[/] {escape(resume_command(shared, overrides))}")
    done = _checkpointed_step(run_dir.path, console)
    if done is not None and done >= cfg.trainer.max_steps:  # nothing to train: say so (exit 0), start nothing
        more = resume_command(shared, overrides, [f"trainer.max_steps={2 * done}"])
        console.print(f"[bold green]run complete[/]: {done}/{cfg.trainer.max_steps} steps done; raise "
                      f"trainer.max_steps to continue it, e.g. {escape(more)}")
        if run_dir.lock is not None:
            run_dir.lock.release()
        if on_complete is not None:
            on_complete()
        return 0
    specs = build_plan(cfg, run_dir.path)
    write_plan(run_dir, specs)
    attempt = 0
    while True:
        stall = StallWatch(run_dir.path / METRICS_FILE, cfg.run.stall_timeout_s, cfg.rollout.start_timeout_s)
        env = {RESTART_ENV: str(attempt)}
        supervisor = Supervisor([replace(s, env={**s.env, **env}) for s in specs], run_dir.log_dir, console=console,
                                verbose=cfg.observe.verbose, stall=stall, restart_log=run_dir.path / RESTARTS_FILE)
        code = supervisor.run()
        if code == 0 or attempt >= cfg.run.max_restarts or not _restartable(cfg, supervisor.failed):
            return code
        kept = _keep_logs(run_dir.log_dir, attempt)
        attempt += 1
        done = _checkpointed_step(run_dir.path, console)
        console.print(f"[bold yellow]restarting[/] the run (restart {attempt} of run.max_restarts="
                      f"{cfg.run.max_restarts}) from step {done or 0}; the failed attempt's logs: {kept}")


def _restartable(cfg: SlimeConfig, failed: str | None) -> bool:
    """A dead trainer rank, or a stall with run.on_stall=restart (a dead server is not: its restart is its own)."""
    return failed == "worker" or (failed == "stall" and cfg.run.on_stall == "restart")


def _keep_logs(log_dir: Path, attempt: int) -> Path:
    """The logs of attempt ``attempt`` (the one that failed), moved to RUN/logs/attempt-<k>/, k its number or, where
    an earlier command's restarts used that name, the next free one; the next attempt writes afresh."""
    kept = log_dir / f"attempt-{attempt}"
    while kept.exists():
        attempt += 1
        kept = log_dir / f"attempt-{attempt}"
    kept.mkdir(parents=True)
    for log in log_dir.glob("*.log"):
        log.rename(kept / log.name)
    return kept


def _checkpointed_step(path: Path, console: Console) -> int | None:
    """Before anything starts: the step of the checkpoint the trainer will resume from (damaged ones are named
    and skipped; None: it starts from step 0), or exit 2 naming the damaged files when the run has checkpoints
    but none is usable."""
    from slimecli.checkpoint.layout import step_of
    from slimecli.checkpoint.manifest import CheckpointDamaged, newest_usable

    try:
        found = newest_usable(path, warn=lambda message: console.print(f"[yellow]warning[/] {escape(message)}"))
    except CheckpointDamaged as exc:
        raise ConfigErrors([ConfigError(str(ckpt), NO_VALUE, f"damaged checkpoint: {why}",
                                        "delete the damaged checkpoint directories to start the run over, "
                                        "or pick another run.dir") for ckpt, why in exc.damaged]) from None
    return None if found is None else step_of(found)
