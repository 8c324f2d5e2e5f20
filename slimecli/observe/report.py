"""`slimecli report`: RUN/report/ with a PNG per panel (observe/plots.py), manifest.json and report.html.

One run: its plots, resolved config, command line and final metrics. Several runs: the same plots with one
line per run, labelled by the config keys that differ between them (observe/runs.py); runs that differ only
by run.seed are one line, the mean over the seeds with a ± std band across them (``seeds="band"``, the
default), or one line each (``seeds="lines"``).
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slimecli.observe.runs import Group, Run, differing_keys, flatten, group_runs, load_run, summary

REPORT_DIR = "report"
HTML_FILE = "report.html"
MANIFEST_FILE = "manifest.json"
SEED_MODES = ("band", "lines")


def default_out_dir(paths: Sequence[str | Path]) -> Path:
    """RUN/report for one run; for several, compare-<time> next to the first run (runs/compare-... for runs in
    runs/)."""
    first = Path(paths[0]).expanduser()
    if len(paths) == 1:
        return first / REPORT_DIR
    return first.resolve().parent / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"


def write_report(paths: Sequence[str | Path], out_dir: str | Path | None = None, *, seeds: str = "band",
                 title: str | None = None, by: Sequence[str] | None = None) -> Path:
    """Render the report of the runs in ``paths``; the path of report.html. NotARun for a path that is not a run
    directory (before anything is written). ``by``: label and group the runs by these config keys only."""
    if not paths:
        raise ValueError("no run directories given")
    if seeds not in SEED_MODES:
        raise ValueError(f"seeds must be one of {', '.join(SEED_MODES)}, got {seeds!r}")
    runs = [load_run(p) for p in paths]
    out = Path(out_dir).expanduser() if out_dir is not None else default_out_dir(paths)
    out.mkdir(parents=True, exist_ok=True)
    groups = group_runs(runs, seeds=seeds, by=by)
    from slimecli.observe.plots import draw_all

    plots = draw_all(groups, out)
    keys = differing_keys([r.config for r in runs])
    manifest = {
        "runs": [{"path": str(r.path), "label": r.label, "seed": r.seed, "steps": len(r.rows)} for r in runs],
        "groups": [{"label": g.display, "runs": [str(r.path) for r in g.runs], "summary": summary(g.runs)}
                   for g in groups],
        "differing_keys": keys,
        "plots": plots,
    }
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, default=str) + "\n", encoding="utf-8")
    page = out / HTML_FILE
    page.write_text(_html(runs, groups, plots, keys, title), encoding="utf-8")
    return page


# ---- report.html ---------------------------------------------------------------------------------------------

CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1400px;padding:0 1em;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
img{max-width:100%;border:1px solid #eee;margin:.5em 0}table{border-collapse:collapse;font-size:.85em}
td,th{border:1px solid #ddd;padding:.2em .6em;text-align:right}th{background:#f6f6f6}td:first-child,th:first-child
{text-align:left}pre{background:#f6f6f6;padding:.8em;overflow-x:auto;font-size:.8em}.muted{color:#777}"""


def _esc(value: Any) -> str:
    return html.escape(str(value))


def _num(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return _esc(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_num(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _final_metrics(runs: Sequence[Run]) -> str:
    """The last row of every run: one column per run, one row per metric."""
    keys = sorted({k for r in runs if r.rows for k in r.rows[-1] if k not in ("time",)},
                  key=lambda k: (k != "step", k))
    if not keys:
        return "<p class=muted>no metrics yet</p>"
    rows = []
    for key in keys:
        values = [r.rows[-1].get(key) if r.rows else None for r in runs]
        if all(v is None for v in values):
            continue
        rows.append([key, *[v if isinstance(v, int | float | str) or v is None else json.dumps(v) for v in values]])
    return _table(["metric", *[_col(r, runs) for r in runs]], rows)


def _col(run: Run, runs: Sequence[Run]) -> str:
    if len(runs) == 1:
        return run.name
    return f"{run.label} [{run.name}]" if run.label != run.name else run.name


def _summary_table(groups: Sequence[Group]) -> str:
    rows, eval_key = [], None
    for g in groups:
        s = summary(g.runs)
        eval_key = eval_key or s["eval_key"]
        reached = f"{s['steps_to_threshold']:.1f}" if s["steps_to_threshold"] is not None else (
            f"not reached by {s['runs'] - s['reached_threshold']} of {s['runs']}" if s["runs"] else None)
        held_out = f"{_num(s['eval_start'])} → {_num(s['eval_end'])}" if s["eval_start"] is not None else None
        rows.append([g.display, s["steps"], s["final_reward"], reached, held_out, s["step_time_s"]])
    return _table(["run", "steps", "final reward (mean of the last 10% of steps)", "first step with reward ≥ 0.8",
                   f"{eval_key or 'held-out reward'}: first → last eval", "median step time (s)"], rows)


def _html(runs: Sequence[Run], groups: Sequence[Group], plots: Sequence[dict[str, Any]], keys: Sequence[str],
          title: str | None) -> str:
    name = title or (runs[0].name if len(runs) == 1 else f"{len(runs)} runs")
    parts = [f"<!doctype html><html><head><meta charset=utf-8><title>slimecli report: {_esc(name)}</title>"
             f"<style>{CSS}</style></head><body><h1>slimecli report: {_esc(name)}</h1>",
             f"<p class=muted>written {_esc(time.strftime('%Y-%m-%d %H:%M:%S'))}</p>"]
    parts.append("<h2>Runs</h2>")
    parts.append(_table(["run", "directory", "label", "steps"],
                        [[r.name, r.path, r.label, len(r.rows)] for r in runs]))
    if len(runs) > 1:
        flat = [flatten(r.config) for r in runs]
        parts.append("<p>config keys that differ:</p>")
        parts.append(_table(["key", *[r.name for r in runs]], [[k, *[str(f.get(k)) for f in flat]] for k in keys])
                     if keys else "<p class=muted>none (the runs differ by seed only)</p>")
    parts.append("<h2>Summary</h2>" + _summary_table(groups))
    parts.append("<h2>Plots</h2>")
    if not plots:
        parts.append("<p class=muted>no metrics to plot yet</p>")
    for plot in plots:
        parts.append(f"<h3>{_esc(plot['title'])}</h3><img src=\"{_esc(plot['file'])}\" alt=\"{_esc(plot['title'])}\">")
    parts.append("<h2>Final metrics</h2>" + _final_metrics(runs))
    parts.append("<h2>Command line</h2>")
    for r in runs:
        label = f"<p>{_esc(r.name)}</p>" if len(runs) > 1 else ""
        parts.append(f"{label}<pre>{_esc(r.command or '(no command.txt)')}</pre>")
    parts.append("<h2>Resolved config</h2>")
    for r in runs:
        text = (r.path / "config.yaml").read_text(encoding="utf-8", errors="replace") if (
            r.path / "config.yaml").is_file() else "(no config.yaml)"
        if len(runs) == 1:
            parts.append(f"<pre>{_esc(text)}</pre>")
        else:
            parts.append(f"<details><summary>{_esc(r.name)}</summary><pre>{_esc(text)}</pre></details>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
