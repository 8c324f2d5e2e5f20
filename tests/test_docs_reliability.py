"""docs/reliability.md's fault table and its defaults: each documented default is the code's, and each test the
table names exists."""

from __future__ import annotations

import re
from typing import Any

from slimecli.config.compose import load
from tests.helpers import ROOT

PAGE = ROOT / "docs" / "reliability.md"


def rows(header: str) -> list[list[str]]:
    """The rows of the table whose header line is ``header``."""
    lines = PAGE.read_text().splitlines()
    start = lines.index(header) + 2
    out = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        out.append([cell.strip() for cell in line.strip("|").split("|")])
    return out


def value_at(cfg: Any, key: str) -> Any:
    node = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return getattr(node, "name", node)  # a config group (sandbox) by its chosen member


def test_every_documented_default_is_the_codes():
    cfg = load([])
    documented = rows("| setting | default |")
    assert len(documented) >= 10
    for key, default in documented:
        key = key.strip("`")
        actual = value_at(cfg, key)
        assert str(actual) == default, f"docs/reliability.md says {key} defaults to {default}; the code: {actual}"


def test_every_test_the_fault_table_names_exists():
    named = {name for row in rows("| part | fault | what happens | test |")
             for name in re.findall(r"`((?:tests/|bench/)?[\w/]+\.py)`", row[3])}
    assert named
    for name in named:
        path = ROOT / name if "/" in name else ROOT / "tests" / name
        assert path.is_file(), f"docs/reliability.md's fault table names {name}, which does not exist"
