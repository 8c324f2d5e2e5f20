"""`slimecli tasks stats`: what a task file holds, before anyone trains on it.

Counts by repository, FAIL_TO_PASS / PASS_TO_PASS sizes, problem statement lengths, the layouts the rows came in
(and the fields none of them knows), and the environment each task would get under the config (planned from
the repository's dependency files, nothing built).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from slimecli.swe.task import SweTask, TaskSet


def spread(values: Sequence[int]) -> dict[str, float]:
    if not values:
        return {"min": 0, "median": 0, "mean": 0, "max": 0}
    return {"min": min(values), "median": statistics.median(values), "mean": round(statistics.fmean(values), 1),
            "max": max(values)}


def summarize(tasks: TaskSet, environment_of: Callable[[SweTask], str] | None = None) -> dict[str, Any]:
    rows = tasks.tasks
    out: dict[str, Any] = {
        "path": tasks.path, "tasks": len(rows), "bad_rows": len({e.source for e in tasks.errors}),
        "layouts": tasks.layouts, "unknown_fields": tasks.unknown_fields,
        "repos": dict(Counter(t.repo for t in rows).most_common()),
        "fail_to_pass": spread([len(t.fail_to_pass) for t in rows]),
        "pass_to_pass": spread([len(t.pass_to_pass) for t in rows]),
        "statement_chars": spread([len(t.problem_statement) for t in rows]),
        "images": sum(bool(t.image) for t in rows), "workdirs": sum(bool(t.workdir) for t in rows),
    }
    kinds = Counter(str(t.extra["synth"].get("kind")) for t in rows if isinstance(t.extra.get("synth"), dict))
    if kinds:
        out["synth_kinds"] = dict(kinds.most_common())
    if environment_of is not None:
        out["environments"] = dict(Counter(environment_of(t) for t in rows).most_common())
    return out


def render(s: dict[str, Any]) -> str:
    def line(name: str, d: dict[str, float]) -> str:
        return f"{name:<16} min {d['min']}  median {d['median']}  mean {d['mean']}  max {d['max']}"

    out = [f"{s['path']}: {s['tasks']} tasks" + (f", {s['bad_rows']} bad rows" if s["bad_rows"] else ""),
           "layouts          " + ", ".join(f"{k} {v}" for k, v in s["layouts"].items())]
    if s["unknown_fields"]:
        out.append("unknown fields   " + ", ".join(f"{k} ({v} rows)" for k, v in s["unknown_fields"].items())
                   + "  (kept in each task's extra)")
    out.append(f"repositories     {len(s['repos'])}")
    out += [f"  {repo:<30} {n}" for repo, n in list(s["repos"].items())[:20]]
    if len(s["repos"]) > 20:
        out.append(f"  ... and {len(s['repos']) - 20} more")
    out += [line("FAIL_TO_PASS", s["fail_to_pass"]), line("PASS_TO_PASS", s["pass_to_pass"]),
            line("statement chars", s["statement_chars"]),
            f"sources          {s['workdirs']} with a workdir, {s['images']} with an image"]
    if "synth_kinds" in s:
        out.append("synthesized bugs " + ", ".join(f"{k} {v}" for k, v in s["synth_kinds"].items()))
    if "environments" in s:
        out.append("environments     " + ", ".join(f"{k} {v}" for k, v in s["environments"].items()))
    return "\n".join(out)
