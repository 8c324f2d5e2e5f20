"""`slimecli tasks synth` and `slimecli tasks stats`: making a task file from a repository, and describing one."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from slimecli.cli.common import OVERRIDES, RecipeDirOption, echo_err, fail, swe_config_or_exit


def synth(ctx: typer.Context, src: Path = typer.Argument(..., help="A git checkout, a directory or an sdist archive."),
          out: Path = typer.Option(..., "--out", "-o", help="The task file to write (JSONL)."),
          repo: Path = typer.Option(None, "--repo", help="Where the tasks' git repository goes [default: OUT's "
                                    "name with -repo]."),
          max_tasks: int = typer.Option(20, "--max", min=1, help="Stop after this many valid tasks."),
          seed: int = typer.Option(0, "--seed", help="Which candidates, in which order: same seed, same file."),
          jobs: int = typer.Option(2, "--jobs", "-j", min=1, help="Test runs and task checks at once."),
          max_fail: int = typer.Option(10, "--max-fail", min=1, help="K: keep a bug only if 1..K tests fail."),
          max_pass: int = typer.Option(50, "--max-pass", min=0, help="PASS_TO_PASS tests kept per task (sampled)."),
          choices: int = typer.Option(0, "--choices", min=0, max=4, help="List N edits per task for agent."
                                      "constrain=choices smoke runs: the gold patch and N-1 wrong edits of the same "
                                      "function (graded: none resolves). 0: none."),
          as_json: bool = typer.Option(False, "--json", help="Print the run's figures as one JSON object."),
          recipe_dir: list[str] = RecipeDirOption) -> None:
    """Make SWE tasks from a Python repository whose tests pass: break covered functions, keep the breaks 1..K
    tests catch, check every task like `tasks check`, write them to OUT. task.environment / task.env_dir /
    sandbox=... say where the suite runs, as for any task."""
    import asyncio

    from slimecli.swe.synth.pipeline import Options, SynthError, synthesize

    if not src.expanduser().exists():
        fail(f"SRC: {src}: no such file or directory")
    cfg = swe_config_or_exit(ctx.args, recipe_dir, sandboxed=True)
    repo_dir = repo or out.with_name(f"{out.stem}-repo")
    if choices == 1:
        fail("--choices: 1 is not a choice; use 0 (no listed edits) or 2..4 (the gold edit and N-1 wrong ones)")
    options = Options(max_tasks=max_tasks, seed=seed, jobs=jobs, max_fail=max_fail, max_pass=max_pass,
                      budget_s=cfg.agent.eval_budget_s, choices=choices)
    try:
        report = asyncio.run(synthesize(src, out, repo_dir, options, cfg.task, cfg.sandbox, say=echo_err))
    except SynthError as exc:
        fail(f"tasks synth: {exc}", code=1)
    figures = report.as_dict()
    if as_json:
        typer.echo(json.dumps(figures))
    minutes = max(report.elapsed_s, 1e-9) / 60
    echo_err(f"{len(report.rows)} valid tasks from {report.tried} candidates tried ({report.broke} broke 1..{max_fail} "
             f"tests) in {report.elapsed_s:.0f}s: {len(report.rows) / minutes:.1f} tasks/min -> {out} "
             f"(repository {repo_dir}; rejected: {dict(report.rejected)})")
    if not report.rows:
        raise typer.Exit(1)


def stats(ctx: typer.Context, file: str = typer.Argument(..., help="A task file (JSONL or parquet), or builtin:NAME."),
          as_json: bool = typer.Option(False, "--json", help="One JSON object."),
          environments: bool = typer.Option(True, "--env/--no-env", help="Plan each task's environment (reads "
                                            "its repository's dependency files; builds nothing)."),
          recipe_dir: list[str] = RecipeDirOption) -> None:
    """Counts by repository, FAIL_TO_PASS / PASS_TO_PASS sizes, statement lengths, layouts, environments."""
    from slimecli.swe.stats import render, summarize
    from slimecli.swe.task import load_for

    cfg = swe_config_or_exit([f"task.path={file}", *ctx.args], recipe_dir)
    tasks = load_for(cfg.task)
    environment_of = None
    if environments:
        from slimecli.swe.env.resolve import EnvUnavailable, plan_task

        def environment_of(task):  # type: ignore[no-untyped-def]
            try:
                return plan_task(task, cfg.task, cfg.sandbox).kind
            except EnvUnavailable as exc:
                return f"unavailable:{exc.reason}"

    summary = summarize(tasks, environment_of)
    typer.echo(json.dumps(summary) if as_json else render(summary))


def register(app: typer.Typer, epilog: str) -> None:
    app.command("synth", context_settings=OVERRIDES, epilog=epilog)(synth)
    app.command("stats", context_settings=OVERRIDES, epilog=epilog)(stats)
