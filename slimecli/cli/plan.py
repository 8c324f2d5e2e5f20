"""`slimecli plan`: the processes a run would start, without starting them."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer

from slimecli.cli.common import OVERRIDES, RecipeDirOption, fail, load_config_or_exit, split_overrides

if TYPE_CHECKING:
    from slimecli.config.schema import SlimeConfig
    from slimecli.launch.spec import ProcessSpec


def register(app: typer.Typer) -> None:
    @app.command("plan", context_settings=OVERRIDES, epilog="""[bold]Examples[/]

  slimecli plan +recipe=swe_agent

  slimecli plan +recipe=opd teacher.model_path=runs/q/final --json""")
    def plan(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
             recipe_dir: list[str] = RecipeDirOption) -> None:
        """Show each process: name, full command, ports, environment, readiness probe.

        A pre-flight check that fails does not hide the plan: it is shown, then the errors, and the exit
        code is 2 (with --json, the plan on stdout and the errors on stderr)."""
        from slimecli.config.errors import ConfigErrors
        from slimecli.launch.free_ports import with_free_ports
        from slimecli.launch.plan import build_plan
        from slimecli.launch.preflight import train_errors
        from slimecli.launch.rundir import default_path

        overrides = split_overrides(ctx.args)
        cfg = load_config_or_exit(overrides, recipe_dir, resume=True)
        if cfg.cluster.name == "slurm":  # what `train` would submit; each node then runs the local plan
            from pathlib import Path

            from slimecli.launch.slurm import node_script, sbatch_script

            run_dir = default_path(cfg).resolve()
            typer.echo(f"# RUN/slurm/job.sbatch (run dir {run_dir}), submitted with sbatch:")
            typer.echo(sbatch_script(cfg, run_dir))
            typer.echo("# RUN/slurm/node.sh, run once on every node:")
            typer.echo(node_script(cfg, run_dir, overrides, recipe_dir, Path.cwd()))
            return
        try:
            launched = with_free_ports(cfg)
        except ConfigErrors as exc:
            fail(exc.render())
        errors = train_errors(launched)
        specs = build_plan(launched, default_path(cfg))
        if as_json:
            typer.echo(json.dumps([s.to_json() for s in specs], indent=2))
        else:
            _print_plan(cfg, specs)
        if errors:
            fail(ConfigErrors(errors).render())


def _print_plan(cfg: SlimeConfig, specs: list[ProcessSpec]) -> None:
    import shlex

    from slimecli.launch.rundir import default_path

    typer.echo(f"launch plan for recipe={cfg.recipe} (run dir {default_path(cfg).resolve()}), in start order:")
    for i, s in enumerate(specs, 1):
        typer.echo(f"\n{i}. {s.name} ({s.kind})")
        typer.echo(f"   command: {shlex.join(s.shown_argv())}")
        typer.echo(f"   ports:   {', '.join(map(str, s.ports)) or '-'}")
        typer.echo(f"   env:     {' '.join(f'{k}={v}' for k, v in s.env.items())}")
        ready = f"GET {s.probe.url} answers {s.probe.status} within {s.start_timeout_s:.0f}s" if s.probe else \
            "- (the run ends when it exits 0)"
        typer.echo(f"   ready:   {ready}")
    auto = auto_port_keys(cfg)
    if auto:
        typer.echo(f"\n{' and '.join(auto)} = auto: the ports above are free now, picked for this plan; "
                   "`slimecli train` picks its own when it starts and records them in RUN/plan.json")


def auto_port_keys(cfg: SlimeConfig) -> list[str]:
    """The port keys left "auto" whose ports this plan shows (the servers it starts)."""
    from slimecli.config.layout import teacher_nodes
    from slimecli.config.port import is_auto
    from slimecli.config.teachers import run_teachers, teacher_view

    keys = ["rollout.port"] if is_auto(cfg.rollout.port) else []
    return keys + [f"{t.key}.port" for t in run_teachers(cfg)
                   if is_auto(t.settings.port) and teacher_nodes(teacher_view(cfg, t))]
