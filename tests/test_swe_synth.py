"""`slimecli tasks synth`: candidate bugs of every kind from the AST, a seeded order, and tasks made from a released
sdist (isodate 0.6.1, cached) that are the same for the same seed, byte for byte, and each pass `tasks check`."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from slimecli.swe.synth.mutate import KINDS, find
from slimecli.swe.synth.pipeline import order
from tests.helpers import invoke_cli
from tests.test_swe_env_real_repo import sdist

SOURCE = '''"""A module."""


def clamp(values, low, high):
    """Docstring stays."""
    out = []
    for i in range(len(values)):
        v = values[i]
        if v < low and not v == high:
            v = low
        else:
            v = max(v, low)
        total = v * 2 + 1  # a comment
        out.append(total)
    return out
'''


def test_every_kind_of_candidate_is_found_and_compiles():
    found = find("pkg/m.py", SOURCE.encode())
    assert {m.kind for m in found} == set(KINDS)
    source = SOURCE.encode()
    for m in found:
        broken = m.apply(source)
        assert broken is not None and broken != source, m
        assert m.function == "clamp" and b'"""Docstring stays."""' in broken
    by_kind = {k: [m for m in found if m.kind == k] for k in KINDS}
    edits = {k: [(source[m.start:m.end], m.new) for m in v] for k, v in by_kind.items()}
    assert (b"<", b">=") in edits["flip_comparison"] and (b"==", b"!=") in edits["flip_comparison"]
    assert (b"len(values)", b"len(values) - 1") in edits["off_by_one"] and (b"i", b"i + 1") in edits["off_by_one"]
    assert (b"+", b"-") in edits["wrong_operator"] and (b"*", b"//") in edits["wrong_operator"]
    assert (b"return out", b"return") in edits["drop_return_value"]
    assert (b"v, low", b"low, v") in edits["swap_arguments"]
    assert (b"v < low and not v == high", b"v < low") in edits["remove_condition"]
    assert (b"not v == high", b"v == high") in edits["remove_condition"]
    assert any(old.strip() == b"out.append(total)" and new == b"" for old, new in edits["remove_statement"])
    [branch] = by_kind["remove_branch"]
    assert source[branch.start:branch.end] == b"        else:\n            v = max(v, low)\n"


def test_the_order_is_seeded_and_spreads_over_functions():
    source = "\n".join(f"def f{i}(a, b):\n    return a + b if a < b else a - b\n" for i in range(6)).encode()
    candidates = [(m, frozenset({"t"})) for m in find("m.py", source)]
    first, again, other = order(candidates, 1, 2), order(candidates, 1, 2), order(candidates, 2, 2)
    assert first == again and first != other
    assert len(first) == 12 and Counter(m.function for m, _ in first) == {f"f{i}": 2 for i in range(6)}
    assert len({m.function for m, _ in first[:6]}) == 6  # one of each function before a second of any
    assert all(m.kind != n.kind for (m, _), (n, _) in zip(first[:6], first[6:], strict=True) if m.function == n.function)


def test_bad_sources_are_refused_clearly(tmp_path):
    missing = invoke_cli("tasks", "synth", str(tmp_path / "nope.tar.gz"), "--out", str(tmp_path / "t.jsonl"))
    assert missing.returncode == 2 and "no such file or directory" in missing.stderr
    repo = tmp_path / "proj"
    repo.mkdir()
    (repo / "m.py").write_text("def one():\n    return 2\n")
    (repo / "test_m.py").write_text("from m import one\n\n\ndef test_one():\n    assert one() == 1\n")
    failing = invoke_cli("tasks", "synth", str(repo), "--out", str(tmp_path / "t.jsonl"), "task.environment=host")
    assert failing.returncode == 1 and "no test passes at base" in failing.stderr, failing.stderr
    assert "Traceback" not in failing.stderr


@pytest.mark.slow
def test_a_released_sdist_gives_the_same_valid_tasks_for_a_seed(tmp_path):
    archive = sdist()
    out, envs = tmp_path / "isodate.jsonl", tmp_path / "envs"
    args = ["--out", str(out), "--max", "2", "--seed", "7", "--max-pass", "8", "--json", f"task.env_dir={envs}"]
    first = invoke_cli("tasks", "synth", str(archive), *args)
    assert first.returncode == 0, first.stderr
    figures = json.loads(first.stdout)
    assert figures["kept"] == 2 and figures["project"] == "isodate" and figures["environment"].startswith("venv")
    assert figures["tried"] >= 2 and figures["passing"] >= 10
    made = out.read_bytes()
    second = invoke_cli("tasks", "synth", str(archive), *args)
    assert second.returncode == 0, second.stderr
    assert out.read_bytes() == made  # same seed, same file: the same bugs, commits and statements

    rows = [json.loads(line) for line in made.decode().splitlines()]
    for row in rows:
        assert row["workdir"] == str(tmp_path / "isodate-repo") and 1 <= len(row["FAIL_TO_PASS"]) <= 10
        assert len(row["PASS_TO_PASS"]) <= 8 and not set(row["FAIL_TO_PASS"]) & set(row["PASS_TO_PASS"])
        statement = row["problem_statement"]
        assert all(f"FAILED {t}" in statement for t in row["FAIL_TO_PASS"][:5])
        changed = [ln[1:].strip() for ln in row["patch"].splitlines()
                   if ln[:1] in "+-" and not ln.startswith(("+++", "---")) and len(ln.strip()) > 8]
        assert not any(line in statement for line in changed), row["instance_id"]  # never the diff
        assert row["synth"]["file"] not in statement
        hidden = {t.split("::")[0] for t in row["FAIL_TO_PASS"]}
        assert {p for p in hidden if f"+++ b/{p}" in row["test_patch"]} == hidden
    checked = invoke_cli("tasks", "check", f"task.path={out}", f"task.env_dir={envs}", "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    results = [json.loads(line) for line in checked.stdout.splitlines()]
    assert len(results) == 2 and all(r["ok"] for r in results)
    for r in results:  # base fails F2P (P2P pass), gold passes all, the empty patch resolves nothing
        assert {c["name"] for c in r["checks"] if c["ok"]} >= {"base", "gold", "empty_diff"}
    stats = invoke_cli("tasks", "stats", str(out), f"task.env_dir={envs}", "--json")
    summary = json.loads(stats.stdout)
    assert summary["tasks"] == 2 and summary["repos"] == {"isodate": 2} and summary["environments"] == {"venv": 2}
    assert sum(summary["synth_kinds"].values()) == 2 and Path(rows[0]["workdir"]).is_dir()
