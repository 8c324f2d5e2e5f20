"""`slimecli teacher serve`: resolve the config into a run directory, then supervise torchrun with tp x dp ranks
(the same plan entry and supervisor that `slimecli train` uses for its teacher)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from slimecli.cli.common import OVERRIDES, RecipeDirOption, command_group, load_config_or_exit, split_overrides

if TYPE_CHECKING:
    from slimecli.config.schema import SlimeConfig

EPILOG = """[bold]Examples[/]

  slimecli teacher serve model.path=RUN/final teacher.tp=2   # CPU: 2 ranks over gloo; prints its URL (a free port)

  slimecli teacher serve teacher.model_path=/ckpt/teacher teacher.dp=2 teacher.max_length=32768

  slimecli teacher serve model.path=RUN/final teacher.port=7999   # on a port of your choosing

  curl -s 127.0.0.1:7999/generate -d '{"input_ids":[1,5,7,9],"sample_n":4,"label_token_ids":[[5,6],[7,8],[9,1]]}'
"""


def _with_teacher_model(cfg: SlimeConfig, overrides: list[str]) -> SlimeConfig:
    """teacher=server serving teacher.model_path, else model.path, else the tiny model (made on first use);
    refused with the pre-flight's messages (those `config validate` prints) when it cannot be served here."""
    from slimecli.cli.serve import served_config
    from slimecli.launch.free_ports import with_free_teacher_port
    from slimecli.launch.preflight import teacher_serve_errors, teacher_source

    key, path = teacher_source(cfg)
    served = replace(cfg, teacher=replace(cfg.teacher, name="server", url=None, model_path=path))
    # teacher.port=auto: a free one, printed with the URL below
    served = served_config(served, overrides, lambda c: teacher_serve_errors(c, key), name="teacher",
                           ports=with_free_teacher_port)
    return replace(served, teacher=replace(served.teacher, model_path=str(Path(path).expanduser().absolute())))


def register(app: typer.Typer) -> None:
    teacher_app = command_group(app, "teacher", "The teacher server (log-probs and samples of a frozen model over "
                                                "HTTP).")

    @teacher_app.command("serve", context_settings=OVERRIDES, epilog=EPILOG)
    def serve(ctx: typer.Context, recipe_dir: list[str] = RecipeDirOption) -> None:
        """Serve a checkpoint: /generate, /healthz, /detect, /info, /get_loads, /update_weights_from_disk."""
        from slimecli.cli.serve import run_dir_or_exit
        from slimecli.config.layout import teacher_address
        from slimecli.launch.plan import teacher_plan
        from slimecli.launch.rundir import write_plan
        from slimecli.launch.supervisor import Supervisor

        overrides = split_overrides(ctx.args)
        cfg = _with_teacher_model(load_config_or_exit(overrides, recipe_dir), overrides)
        run = run_dir_or_exit(cfg, overrides)
        t = cfg.teacher
        host, port = teacher_address(cfg, cfg.cluster.node_rank)  # teacher.every_node: this node's address
        typer.echo(f"teacher: run dir {run.path}; {t.tp * t.dp} rank(s) (tp={t.tp}, dp={t.dp}); "
                   f"http://{host}:{port}", err=True)
        specs = teacher_plan(cfg, run.path)
        write_plan(run, specs)
        from slimecli.observe.restarts import RESTARTS_FILE

        raise typer.Exit(Supervisor(specs, run.log_dir, restart_log=run.path / RESTARTS_FILE).run())
