"""`slimecli tasks list|check|grade|env|synth|stats`: SWE task sets, their validation, and grading one patch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from slimecli.cli import tasks_make
from slimecli.cli.common import OVERRIDES, RecipeDirOption, echo_err, fail, swe_config_or_exit

if TYPE_CHECKING:
    from slimecli.config.schema import SlimeConfig

EPILOG = """[bold]Examples[/]

  slimecli tasks list                                             # built-in sets

  slimecli tasks list task.path=swe.jsonl                         # the rows of a task file

  slimecli tasks check task.path=builtin:swe_tiny                 # every task: F2P fail at base, pass with gold

  slimecli tasks grade task.instance=tiny-calc-001 --patch fix.diff      # {resolved, f2p, p2p, applied, ...}

  slimecli tasks env build task.path=swe.jsonl                    # every task's environment, ahead of a run

  slimecli tasks env list                                         # the cached environments and their sizes

  slimecli tasks env prune                                        # remove them all (or: prune KEY ...)

  slimecli tasks synth toolz-1.0.0.tar.gz --out toolz.jsonl --max 20     # tasks made from a repository

  slimecli tasks stats swe-gym.parquet task.repos_dir=~/mirrors   # repositories, test counts, environments
"""

tasks_app = typer.Typer(help="SWE task sets: list them, check every task, grade a patch.", no_args_is_help=True,
                        rich_markup_mode="rich")


def _tasks(cfg: SlimeConfig):
    from slimecli.swe.task import load_for

    tasks = load_for(cfg.task)
    if tasks.errors:
        echo_err(f"{len(tasks.errors)} bad row(s) skipped (task.on_invalid=skip)")
    return tasks


@tasks_app.command("list", context_settings=OVERRIDES, epilog=EPILOG)
def list_(ctx: typer.Context, recipe_dir: list[str] = RecipeDirOption) -> None:
    """The built-in task sets; with task.path=FILE, that file's tasks."""
    from slimecli.swe.builtin import list_sets

    if not ctx.args:
        for info in list_sets():
            typer.echo(f"builtin:{info['name']:<12} {info['tasks']:>3} tasks over {len(info['repos'])} repos "
                       f"({', '.join(info['repos'])})  {info['description']}")
        typer.echo("task.path also takes a SWE-bench JSONL file: one row per task with instance_id, repo, "
                   "base_commit, problem_statement, patch, test_patch, FAIL_TO_PASS, PASS_TO_PASS, workdir")
        return
    cfg = swe_config_or_exit(ctx.args, recipe_dir)
    tasks = _tasks(cfg)
    width = max(len(t.instance_id) for t in tasks.tasks)
    for t in tasks.tasks:
        first = t.problem_statement.strip().splitlines()[0][:70]
        typer.echo(f"{t.instance_id:<{width}}  {t.repo}  F2P {len(t.fail_to_pass)}  P2P {len(t.pass_to_pass)}  {first}")


@tasks_app.command("check", context_settings=OVERRIDES, epilog=EPILOG)
def check(ctx: typer.Context, recipe_dir: list[str] = RecipeDirOption,
          jobs: int = typer.Option(2, "--jobs", "-j", min=1, help="Tasks checked at once."),
          as_json: bool = typer.Option(False, "--json", help="One JSON object per task.")) -> None:
    """Validate every task (or task.instance): F2P fail at base and pass with the gold patch, P2P pass before
    and after, an empty diff and a diff that deletes the tests score 0. Exit 1 if any task fails."""
    import asyncio

    from slimecli.swe.check import check_all
    from slimecli.swe.env.resolve import grading_sandboxes

    cfg = swe_config_or_exit(ctx.args, recipe_dir, sandboxed=True)
    tasks = _tasks(cfg)
    chosen = [t for t in tasks.tasks if cfg.task.instance in (None, t.instance_id)]
    results = asyncio.run(check_all(chosen, concurrency=jobs, budget_s=cfg.agent.eval_budget_s,
                                    sandboxes_for=lambda t: grading_sandboxes(t, cfg.task, cfg.sandbox)))
    bad = 0
    for task, result in zip(chosen, results, strict=True):
        if as_json:
            typer.echo(json.dumps(result.as_dict()))
        else:
            typer.echo(f"{'ok  ' if result.ok else 'FAIL'} {task.instance_id}"
                       + ("" if result.ok else f": {result.why}"))
        bad += not result.ok
    echo_err(f"{len(chosen) - bad}/{len(chosen)} tasks valid")
    if bad:
        raise typer.Exit(1)


@tasks_app.command("grade", context_settings=OVERRIDES, epilog=EPILOG)
def grade(ctx: typer.Context, recipe_dir: list[str] = RecipeDirOption,
          patch: Path = typer.Option(..., "--patch", help="The diff to grade (git diff format); '-' reads stdin."),
          ) -> None:
    """Grade one patch on task.instance in a fresh sandbox; print the reward dict as JSON."""
    import asyncio
    import sys

    from slimecli.swe.env.resolve import grading_sandboxes
    from slimecli.swe.grade import Unevaluatable
    from slimecli.swe.grade import grade as grade_patch

    cfg = swe_config_or_exit(ctx.args, recipe_dir, sandboxed=True)
    if cfg.task.instance is None:
        fail("tasks grade needs task.instance=ID (`slimecli tasks list task.path=...` lists them)")
    if str(patch) == "-":
        diff = sys.stdin.read()
    else:
        try:
            diff = patch.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            fail(f"--patch: cannot read {patch}: {exc}")
    task = _tasks(cfg).get(cfg.task.instance)
    assert task is not None  # the task rules checked it
    try:
        sandboxes = grading_sandboxes(task, cfg.task, cfg.sandbox)
        report = asyncio.run(grade_patch(task, diff, sandbox_factory=sandboxes,
                                         budget_s=cfg.agent.eval_budget_s, partial=cfg.reward.partial))
    except Unevaluatable as exc:
        fail(f"{task.instance_id}: unevaluatable:{exc}", code=1)
    out: dict[str, Any] = {**report.as_dict(), "reward": report.reward(cfg.reward.partial)}
    typer.echo(json.dumps(out))


env_app = typer.Typer(help="Task environments (task.environment: the packages a SWE task runs with): build them "
                           "ahead of a run, list, remove. Not an RL environment (env=...: see `slimecli env`).",
                      no_args_is_help=True, rich_markup_mode="rich")


@env_app.command("build", context_settings=OVERRIDES, epilog=EPILOG)
def env_build(ctx: typer.Context, recipe_dir: list[str] = RecipeDirOption) -> None:
    """Build the environment of every task (or task.instance) now, retrying failed builds; exit 1 if any fails."""
    from slimecli.swe.env.resolve import EnvUnavailable, describe, resolve

    cfg = swe_config_or_exit(ctx.args, recipe_dir)
    chosen = [t for t in _tasks(cfg).tasks if cfg.task.instance in (None, t.instance_id)]
    bad = 0
    for task in chosen:
        try:
            env = resolve(task, cfg.task, cfg.sandbox, retry=True)
        except EnvUnavailable as exc:
            typer.echo(f"FAIL {task.instance_id}: env:{exc.reason}: {describe(exc)}")
            bad += 1
            continue
        where = env.key or env.image or env.bin_dir
        typer.echo(f"ok   {task.instance_id}: {env.kind} {where} ({env.why})")
    echo_err(f"{len(chosen) - bad}/{len(chosen)} task environments ready")
    if bad:
        raise typer.Exit(1)


@env_app.command("list", context_settings=OVERRIDES, epilog=EPILOG)
def env_list(ctx: typer.Context, recipe_dir: list[str] = RecipeDirOption,
             as_json: bool = typer.Option(False, "--json", help="One JSON object per environment.")) -> None:
    """The cached environments under task.env_dir: key, size, what built it."""
    from slimecli.swe.env.resolve import store_for

    cfg = swe_config_or_exit(ctx.args, recipe_dir)
    store = store_for(cfg.task)
    entries = store.entries()
    for e in entries:
        if as_json:
            typer.echo(json.dumps({"key": e.key, "path": str(e.path), "size_bytes": e.size_bytes,
                                   "runner": e.manifest.get("runner"), "for": e.manifest.get("for")}))
        else:
            typer.echo(f"{e.key}  {e.size_bytes / 2**20:8.1f} MiB  {e.manifest.get('runner', '')}  "
                       f"first built for {e.manifest.get('for') or '-'}")
    echo_err(f"{len(entries)} environment(s), {sum(e.size_bytes for e in entries) / 2**20:.1f} MiB under {store.root}")


@env_app.command("prune", context_settings=OVERRIDES, epilog=EPILOG)
def env_prune(ctx: typer.Context, recipe_dir: list[str] = RecipeDirOption) -> None:
    """Remove cached environments: the KEYs given (as `tasks env list` prints them), else all of them."""
    from slimecli.swe.env.resolve import store_for

    keys = [a for a in ctx.args if "=" not in a]
    cfg = swe_config_or_exit([a for a in ctx.args if "=" in a], recipe_dir)
    store = store_for(cfg.task)
    unknown = [k for k in keys if not store.path(k).is_dir()]
    if unknown:
        fail(f"no cached environment {', '.join(unknown)} under {store.root} (`slimecli tasks env list` lists them)")
    removed = store.prune(keys or None)
    echo_err(f"removed {len(removed)} environment(s) from {store.root}")


tasks_app.add_typer(env_app, name="env")
tasks_make.register(tasks_app, EPILOG)


def register(app: typer.Typer) -> None:
    app.add_typer(tasks_app, name="tasks")
