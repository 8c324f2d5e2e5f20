"""The layout the README and docs/architecture.md show is the package's: every package under slimecli/, each in
the layer tests/test_layers.py enforces, agent/ with each of its subpackages. A package added, moved or given a
new layer without its row fails here."""

from __future__ import annotations

import re

import pytest

from tests.helpers import ROOT
from tests.test_layers import LAYER

PACKAGE = ROOT / "slimecli"
CELL = re.compile(r"`([a-z_]+)`")


def packages() -> set[str]:
    """slimecli's subsystems: its folders of modules (rollout/ is a namespace package) and its top-level modules."""
    found = {p.name for p in PACKAGE.iterdir() if p.is_dir() and any(p.glob("*.py"))}
    found |= {p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("__")}
    return found


def layer_rows(doc: str) -> dict[str, tuple[int, str]]:
    """package -> (layer, the rest of its row) from the doc's table whose first column is the layer."""
    rows: dict[str, tuple[int, str]] = {}
    for line in (ROOT / doc).read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) >= 3 and cells[0].isdigit():
            for name in CELL.findall(cells[1]):
                rows[name] = (int(cells[0]), cells[2])
    return rows


@pytest.mark.parametrize("doc", ["README.md", "docs/architecture.md"])
def test_layer_table_shows_every_package_in_its_layer(doc: str) -> None:
    rows = layer_rows(doc)
    assert set(rows) == packages(), f"{doc}: packages in the table differ from slimecli/'s"
    wrong = {name: (layer, LAYER[name]) for name, (layer, _) in rows.items() if layer != LAYER[name]}
    assert not wrong, f"{doc}: (shown layer, tests/test_layers.py's) differ for {wrong}"


def test_readme_names_every_agent_subpackage() -> None:
    agent = layer_rows("README.md")["agent"][1]
    subpackages = sorted(p.name for p in (PACKAGE / "agent").iterdir() if (p / "__init__.py").is_file())
    assert subpackages and all(f"`{name}/`" in agent for name in subpackages), agent
