"""`slimecli report RUN [RUN ...]`: plots and an HTML page of one run, or several overlaid."""

from __future__ import annotations

from pathlib import Path

import typer

from slimecli.cli.common import fail


def register(app: typer.Typer) -> None:
    @app.command("report", epilog="""[bold]Examples[/]

  slimecli report runs/quickstart-20260101-120000      # writes RUN/report/report.html

  slimecli report runs/adam-* runs/sadam-* --out cmp    # overlay, labelled by config keys

  slimecli report runs/a runs/b --seeds lines           # a line per seed, not mean ± std""")
    def report(
        runs: list[Path] = typer.Argument(..., help="Run directories (as `slimecli train` printed them).",
                                          show_default=False),
        out: Path | None = typer.Option(None, "--out", "-o",
                                        help="Where to write (default: RUN/report for one run, "
                                             "compare-<time> next to the first run for several)."),
        seeds: str = typer.Option("band", "--seeds",
                                  help="Runs that differ only by run.seed: 'band' (mean ± std across seeds) or "
                                       "'lines' (one line each)."),
        by: list[str] = typer.Option([], "--by", help="Label and group the runs by this config key only "
                                                      "(repeatable), e.g. --by optimizer.name.", show_default=False),
        title: str | None = typer.Option(None, "--title", help="The page's title."),
    ) -> None:
        """Write PNG plots (reward, eval, losses, KL, entropy, clip fraction, grad norm, response length, step
        time) and report.html (plots, resolved config, command line, final metrics) of one run or several."""
        from slimecli.observe.report import SEED_MODES, write_report
        from slimecli.observe.runs import NotARun

        if seeds not in SEED_MODES:
            fail(f"--seeds: expected one of {', '.join(SEED_MODES)}, got {seeds!r}")
        try:
            page = write_report(runs, out, seeds=seeds, title=title, by=by or None)
        except NotARun as exc:
            fail(str(exc))
        typer.echo(f"report: {page}")
