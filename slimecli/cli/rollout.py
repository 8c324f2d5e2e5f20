"""`slimecli rollout serve`: the embedded rollout engine (SGLang's native HTTP API) as a standalone server;
`slimecli rollout reverify`: the rewards of a rollout dump scored again."""

from __future__ import annotations

import typer

from slimecli.cli.common import OVERRIDES, RecipeDirOption, command_group, load_config_or_exit, split_overrides


def register(app: typer.Typer) -> None:
    rollout_app = command_group(app, "rollout", "Rollout engines and dumps: serve the embedded engine, score a "
                                               "dump's samples again.")

    @rollout_app.command("serve", context_settings=OVERRIDES, epilog="""[bold]Examples[/]

  slimecli rollout serve                                  # the tiny model on a free port; prints its URL

  slimecli rollout serve model.path=/ckpt/qwen3-0.6b rollout.port=30001 model.dtype=bfloat16""")
    def serve(ctx: typer.Context, index: int = typer.Option(0, "--index", help="Listen on rollout.port + INDEX."),
              recipe_dir: list[str] = RecipeDirOption) -> None:
        """Serve /generate and the rest of SGLang's native API for model.path (or model=tiny)."""
        from slimecli.cli.serve import run_dir_or_exit, served_config
        from slimecli.config.layout import engine_slot
        from slimecli.engine.__main__ import start
        from slimecli.launch.free_ports import with_free_rollout_port
        from slimecli.launch.preflight import materialize, rollout_serve_errors

        overrides = split_overrides(ctx.args)
        cfg = served_config(load_config_or_exit(overrides, recipe_dir), overrides,
                            lambda c: rollout_serve_errors(c, index), name="rollout",
                            ports=lambda c: with_free_rollout_port(c, engines=index + 1))  # engine INDEX: a free port
        cfg = materialize(cfg)
        run = run_dir_or_exit(cfg, overrides)
        typer.echo(f"rollout: run dir {run.path}; serving on {engine_slot(cfg, index).url}", err=True)
        start(cfg, index, run.path)

    @rollout_app.command("reverify", context_settings=OVERRIDES, epilog="""[bold]Examples[/]

  slimecli rollout reverify runs/r1                        # the run's own reward config, as it is now

  slimecli rollout reverify runs/r1 reward=math reward.key=score""")
    def reverify(ctx: typer.Context,
                 path: str = typer.Argument(..., help="A run trained with rollout.dump=true, or its rollouts/ folder."),
                 recipe_dir: list[str] = RecipeDirOption) -> None:
        """Score a rollout dump's samples again with the reward config (the run's, with these overrides) and list
        the samples whose reward changed."""
        from slimecli.cli.common import fail
        from slimecli.rollout.dump import dump_dir, dumped_run, dumped_steps
        from slimecli.rollout.reverify import run_reverify

        root = dump_dir(path)
        if not root.is_dir() or not dumped_steps(root):
            fail(f"{path}: no rollout dump here (rollouts/step_<k>.jsonl); train with rollout.dump=true first")
        overrides = split_overrides(ctx.args)
        run = dumped_run(path)
        stored = run is not None and (run / "config.yaml").is_file()
        if stored and not any(o.split("=", 1)[0].lstrip("+~") == "run.dir" for o in overrides):
            overrides = [f"run.dir={run}", *overrides]  # the run's own config is the base the overrides change
        cfg = load_config_or_exit(overrides, recipe_dir, resume=stored)
        if cfg.reward.name == "env":
            fail("reward=env: an environment's episodes were scored by the environment, which a dump does not "
                 "hold; reverify with a reward function (reward=NAME)")
        result = run_reverify(root, cfg.reward)
        for c in result.changes:
            typer.echo(f"step {c.step} sample {c.index}: {_shown(c.before)} -> {_shown(c.after)}")
        typer.echo(f"{len(result.changes)} of {result.samples} samples changed reward over {result.steps} "
                   f"dumped steps (reward={cfg.reward.name})")


def _shown(value: float | None) -> str:
    return "invalid" if value is None else f"{value:g}"
