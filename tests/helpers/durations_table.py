"""The markdown table of docs/testing.md: the slowest tests of the last `make test`, from the durations the
suite records in .test-durations.json (set-up, call and tear-down together), each with what it runs (the
first sentence of its docstring, or of its module's).

    python -m tests.helpers.durations_table [N]     # prints the table of the N slowest (default 30) and
                                                    # rewrites tests/file_costs.json (seconds per test file)
"""

from __future__ import annotations

import ast
import json
import sys
from functools import cache
from pathlib import Path

from tests.helpers import ROOT

DURATIONS = ROOT / ".test-durations.json"
FILE_COSTS = ROOT / "tests" / "file_costs.json"


def _first_sentence(doc: str | None, limit: int = 140) -> str:
    paragraph = " ".join((doc or "").strip().split("\n\n")[0].split())
    sentence = paragraph.split(". ")[0].rstrip(".")
    return sentence if len(sentence) <= limit else sentence[:limit - 1].rstrip() + "…"


@cache
def _docstrings(path: Path) -> dict[str, str]:
    """The first sentence of a test module's docstring (under "") and of each function's (under its name)."""
    tree = ast.parse(path.read_text())
    found = {"": _first_sentence(ast.get_docstring(tree))}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found[node.name] = _first_sentence(ast.get_docstring(node))
    return found


def what(nodeid: str) -> str:
    file, _, name = nodeid.partition("::")
    docs = _docstrings(ROOT / file)
    return docs.get(name.split("::")[-1].split("[")[0]) or docs[""]


def exists(nodeid: str) -> bool:
    """Still in the suite (the file keeps the durations of earlier runs, renamed tests included)."""
    file, _, name = nodeid.partition("::")
    path = ROOT / file
    return path.is_file() and name.split("::")[-1].split("[")[0] in _docstrings(path)


def table(durations: dict[str, float], n: int) -> str:
    durations = {k: v for k, v in durations.items() if exists(k)}
    total = sum(durations.values())
    rows = sorted(durations.items(), key=lambda kv: -kv[1])[:n]
    lines = ["| # | test | seconds | share | what it runs |", "|---|---|---|---|---|"]
    for rank, (nodeid, seconds) in enumerate(rows, 1):
        text = what(nodeid).replace("|", "\\|")
        lines.append(f"| {rank} | `{nodeid}` | {seconds:.1f} | {100 * seconds / total:.1f}% | {text} |")
    lines.append(f"\n{len(durations)} tests, {total / 60:.1f} min of test time in all (both workers together).")
    return "\n".join(lines)


def main() -> None:
    if not DURATIONS.is_file():
        sys.exit(f"{DURATIONS.name}: no durations recorded yet; run make test first")
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    durations = {k: v for k, v in json.loads(DURATIONS.read_text()).items() if exists(k)}
    print(table(durations, n))
    FILE_COSTS.write_text(json.dumps(file_costs(durations), indent=0, sort_keys=True) + "\n")


def file_costs(durations: dict[str, float]) -> dict[str, float]:
    """Seconds per test file: the order tests/conftest.py hands files to the workers in, costliest first."""
    costs: dict[str, float] = {}
    for nodeid, seconds in durations.items():
        file = nodeid.split("::")[0]
        costs[file] = round(costs.get(file, 0.0) + seconds, 1)
    return costs


if __name__ == "__main__":
    main()
