"""`slimecli teacher serve`: resolve the config into a run directory, then exec torchrun with tp x dp ranks."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import typer

from slimecli.cli.common import OVERRIDES, RecipeDirOption, fail, load_config_or_exit, split_overrides

EPILOG = """[bold]Examples[/]

  slimecli teacher serve model.path=RUN/final teacher.tp=2 teacher.port=7999     # CPU: 2 ranks over gloo

  slimecli teacher serve teacher.model_path=/ckpt/teacher teacher.dp=2 teacher.max_length=32768

  curl -s 127.0.0.1:7999/generate -d '{"input_ids":[1,5,7,9],"sample_n":4,"label_token_ids":[[5,6],[7,8],[9,1]]}'
"""


def _with_teacher_model(cfg, overrides: list[str]):
    """teacher.model_path wins; else model.path; else the tiny model (made on first use)."""
    t = cfg.teacher
    path = t.model_path
    if not path:
        from slimecli.model.loading import resolve_model_path

        try:
            path = str(resolve_model_path(cfg.model))
        except ValueError as exc:
            fail(f"teacher serve needs a checkpoint: set model.path=DIR or teacher.model_path=DIR ({exc})")
    path = str(Path(path).expanduser().absolute())
    if not (Path(path) / "config.json").is_file():
        fail(f"teacher serve: {path} is not a Hugging Face checkpoint directory (no config.json)")
    run = cfg.run
    if not any(o.startswith(("run.name=", "run.dir=")) for o in overrides):
        run = replace(run, name="teacher")
    return replace(cfg, run=run, teacher=replace(t, name="server", url=None, model_path=path))


def register(app: typer.Typer) -> None:
    teacher_app = typer.Typer(help="The teacher server (log-probs and samples of a frozen model over HTTP).",
                              no_args_is_help=True)
    app.add_typer(teacher_app, name="teacher")

    @teacher_app.command("serve", context_settings=OVERRIDES, epilog=EPILOG)
    def serve(ctx: typer.Context, recipe_dir: list[str] = RecipeDirOption) -> None:
        """Serve a checkpoint: /generate, /healthz, /detect, /info, /get_loads, /update_weights_from_disk."""
        from slimecli.launch.rundir import prepare
        from slimecli.launch.torchrun import torchrun_argv

        overrides = split_overrides(ctx.args)
        cfg = _with_teacher_model(load_config_or_exit(overrides, recipe_dir), overrides)
        run = prepare(cfg, sys.argv, overrides)
        t = cfg.teacher
        argv = torchrun_argv("slimecli.teacher", ["--config", str(run.config_path)], t.tp * t.dp)
        # The ranks import slimecli from wherever this process did (a source checkout need not be installed).
        pkg_root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "SLIMECLI_RUN_DIR": str(run.path),
               "PYTHONPATH": os.pathsep.join(p for p in (pkg_root, os.environ.get("PYTHONPATH")) if p)}
        typer.echo(f"teacher: run dir {run.path}; {t.tp * t.dp} rank(s) (tp={t.tp}, dp={t.dp}); "
                   f"http://{t.host}:{t.port}", err=True)
        sys.stderr.flush()
        os.execvpe(argv[0], argv, env)
