"""`slimecli tasks synth`: candidate bugs of every kind from the AST, a seeded order, and tasks made from a released
sdist (isodate 0.6.1, cached) that are the same for the same seed, byte for byte, and each pass `tasks check`;
`--choices` rows list the gold edit and wrong edits of the same function."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from slimecli.swe.check import file_diff
from slimecli.swe.synth.choices import LABELS, choice_fields, wrong_files, wrong_patches
from slimecli.swe.synth.mutate import KINDS, find
from slimecli.swe.synth.pipeline import order
from tests.helpers import invoke_cli
from tests.test_swe_env_real_repo import sdist, session_envs

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


def test_wrong_choices_are_other_edits_of_the_function_that_leave_the_bug():
    source = SOURCE.encode()
    found = find("pkg/m.py", source)
    kept = next(m for m in found if m.kind == "drop_return_value")
    mutated = kept.apply(source)
    assert mutated is not None
    lines = {n: {"t::a"} for n in range(1, 20)}
    wrong = wrong_files(kept, source, mutated, lines, {"t::a"}, 2, seed=3)
    assert len(wrong) == 2 and wrong == wrong_files(kept, source, mutated, lines, {"t::a"}, 2, seed=3)
    for text in wrong:
        assert text != mutated and b"    return\n" in text  # the bug stays; one more line of clamp changed
        compile(text, "m.py", "exec")
    assert wrong_files(kept, source, mutated, {}, {"t::a"}, 2, seed=3) == []  # no line the failing tests run
    patch = file_diff("pkg/m.py", mutated.decode(), source.decode())
    fields = choice_fields("p.synth.x", "pkg/m.py", mutated, patch, wrong)
    commands = [c["shell"] for c in fields["choices"]]
    assert commands[fields["gold_choice"]].startswith(LABELS[0] + "\ngit apply <<")
    assert len({c.split()[1] for c in commands}) == 3  # each starts with its own word: they part at one token
    assert wrong_patches({**fields}) == [file_diff("pkg/m.py", mutated.decode(), w.decode()) for w in wrong]


@pytest.mark.slow
def test_a_released_sdist_gives_the_same_valid_tasks_for_a_seed(tmp_path, tmp_path_factory):
    """Synthesis checks every row like `tasks check` before writing it (and grades each wrong choice), so the
    rows are not checked again here; a mutation that breaks a check is covered by tests/test_swe_check.py."""
    archive = sdist()
    out, envs = tmp_path / "isodate.jsonl", session_envs(tmp_path_factory)
    args = ["--out", str(out), "--max", "1", "--seed", "7", "--max-pass", "8", "--choices", "3", "--json",
            f"task.env_dir={envs}"]
    first = invoke_cli("tasks", "synth", str(archive), *args)
    assert first.returncode == 0, first.stderr
    figures = json.loads(first.stdout)
    assert figures["kept"] == 1 and figures["project"] == "isodate" and figures["environment"].startswith("venv")
    assert figures["tried"] >= 1 and figures["passing"] >= 10
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
        assert len(row["choices"]) == 3 and row["patch"] in row["choices"][row["gold_choice"]]["shell"]
        assert all(f"--- a/{row['synth']['file']}" in p and p != row["patch"] for p in wrong_patches(row))
    stats = invoke_cli("tasks", "stats", str(out), f"task.env_dir={envs}", "--json")
    summary = json.loads(stats.stdout)
    assert summary["tasks"] == 1 and summary["repos"] == {"isodate": 1} and summary["environments"] == {"venv": 1}
    assert sum(summary["synth_kinds"].values()) == 1 and Path(rows[0]["workdir"]).is_dir()
