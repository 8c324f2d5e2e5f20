"""Published SWE datasets load as they are: a few rows in each layout (SWE-bench, SWE-Gym, SWE-smith, R2E-Gym),
in JSONL and parquet, their repositories found in a mirror directory; mapped rows are gradable (`tasks check`);
a malformed row is a config error naming FILE:LINE: FIELD."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from slimecli.swe.check import file_diff
from slimecli.swe.formats import detect, reverse_patch
from slimecli.swe.task import TaskFileError, load
from tests.helpers import git, invoke_cli

GOOD = "def add(a, b):\n    return a + b\n"
BAD = "def add(a, b):\n    return a - b\n"
TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n"
F2P, P2P = ["tests/test_calc.py::test_add"], ["tests/test_calc.py::test_zero"]


def commit(repo: Path, files: dict[str, str | None], message: str) -> str:
    for path, text in files.items():
        target = repo / path
        if text is None:
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", message, cwd=repo)
    return git("rev-parse", "HEAD", cwd=repo)


@pytest.fixture(scope="module")
def mirrors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """octo__calc: a SWE-bench-style history (buggy base, fixed later); the SWE-smith mirror
    octo__calc.c0ffee12: a clean commit, then the instance's branch: the bug, then its tests removed."""
    root = tmp_path_factory.mktemp("mirrors")
    bench = root / "octo__calc"
    bench.mkdir()
    git("init", "-q", "-b", "main", ".", cwd=bench)
    base = commit(bench, {"calc.py": BAD, "README": "calc\n"}, "calc")
    (root / "calc").symlink_to(bench)  # R2E-Gym names repositories by their short name
    smith = root / "octo__calc.c0ffee12"
    smith.mkdir()
    git("init", "-q", "-b", "main", ".", cwd=smith)
    commit(smith, {"calc.py": GOOD, "tests/test_calc.py": TEST}, "clean")
    git("checkout", "-q", "-b", "octo__calc.c0ffee12.flip__1", cwd=smith)
    commit(smith, {"calc.py": BAD}, "bug")
    commit(smith, {"tests/test_calc.py": None}, "remove F2P tests")
    git("checkout", "-q", "main", cwd=smith)
    return {"root": str(root), "base": base}


def swebench_row(base: str) -> dict:
    return {"repo": "octo/calc", "instance_id": "octo__calc-1", "base_commit": base,
            "patch": file_diff("calc.py", BAD, GOOD), "test_patch": file_diff("tests/test_calc.py", None, TEST),
            "problem_statement": "add() subtracts", "hints_text": "", "created_at": "2024-01-01T00:00:00Z",
            "version": "1.0", "FAIL_TO_PASS": json.dumps(F2P), "PASS_TO_PASS": json.dumps(P2P),
            "environment_setup_commit": base}


def swegym_row(base: str) -> dict:
    row = {k: v for k, v in swebench_row(base).items() if k != "environment_setup_commit"}
    return {**row, "instance_id": "octo__calc-2", "FAIL_TO_PASS": F2P, "PASS_TO_PASS": P2P}


def swesmith_row() -> dict:
    return {"instance_id": "octo__calc.c0ffee12.flip__1", "repo": "swesmith/octo__calc.c0ffee12",
            "patch": file_diff("calc.py", GOOD, BAD), "FAIL_TO_PASS": F2P, "PASS_TO_PASS": P2P,
            "created_at": "2025-04-01T00:00:00", "image_name": "swesmith.x86_64.octo__calc.c0ffee12",
            "base_commit": "c0ffee12", "problem_statement": "add() gives 2 - 3 for add(2, 3)"}


def r2egym_row() -> dict:
    hunk = {"descriptor": {"old_range": {"start": 1, "length": 2}, "new_range": {"start": 1, "length": 2},
                           "section": ""},
            "line_group": {"all_lines": [{"content": "def add(a, b):", "type": "context"},
                                         {"content": "    return a - b", "type": "deleted"},
                                         {"content": "    return a + b", "type": "added"}]}}
    parsed = {"file_diffs": [{"header": {"file": {"path": "calc.py"}, "misc_line": None}, "old_file_content": BAD,
                              "new_file_content": GOOD, "minus_file": {"path": "a/calc.py"},
                              "plus_file": {"path": "b/calc.py"}, "hunks": [hunk]}],
              "old_commit_hash": "1" * 40, "new_commit_hash": "2" * 40, "commit_message": "fix add",
              "commit_date": "2024-01-01T00:00:00"}
    summary = "=== short test summary info ===\n{} r2e_tests/test_1.py::test_add\nPASSED r2e_tests/test_1.py::test_zero\n"
    execution = {"test_file_names": ["test_1.py"], "test_file_codes": [TEST], "setup_res_code": 0,
                 "old_commit_res_stdout": summary.format("FAILED"), "new_commit_res_stdout": summary.format("PASSED")}
    return {"repo_name": "calc", "docker_image": "namanjain12/calc_final:" + "2" * 40, "commit_hash": "2" * 40,
            "problem_statement": "[ISSUE]\nadd() subtracts\n[/ISSUE]", "prompt": "", "relevant_files": [],
            "parsed_commit_content": json.dumps(parsed), "execution_result_content": json.dumps(execution),
            "expected_output_json": json.dumps({"test_add": "PASSED", "test_zero": "PASSED"}),
            "modified_files": ["calc.py"], "modified_entity_summaries": [], "num_non_test_files": 1,
            "num_non_test_func_methods": 1, "num_non_test_lines": 2}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_each_layout_is_detected_and_mapped(mirrors, tmp_path):
    rows = [swebench_row(mirrors["base"]), swegym_row(mirrors["base"]), swesmith_row(), r2egym_row()]
    assert [detect(r) for r in rows] == ["swebench", "swegym", "swesmith", "r2egym"]
    loaded = load(str(write_jsonl(tmp_path / "mixed.jsonl", rows)), "auto", mirrors["root"])
    assert loaded.errors == [] and loaded.layouts == {"swebench": 1, "swegym": 1, "swesmith": 1, "r2egym": 1}
    bench, gym, smith, r2e = loaded.tasks
    assert bench.fail_to_pass == tuple(F2P) and gym.pass_to_pass == tuple(P2P)  # JSON string and list alike
    assert bench.workdir == str(Path(mirrors["root"]) / "octo__calc")
    assert bench.image == "swebench/sweb.eval.x86_64.octo_1776_calc-1:latest"
    assert smith.repo == "octo/calc" and smith.base_commit == "octo__calc.c0ffee12.flip__1~1"
    assert smith.patch == file_diff("calc.py", BAD, GOOD) and smith.test_patch == ""  # the bug, reversed
    assert smith.image == "jyangballin/swesmith.x86_64.octo_1776_calc.c0ffee12:latest"
    assert smith.workdir == str(Path(mirrors["root"]) / "octo__calc.c0ffee12")
    assert r2e.instance_id == "calc-" + "2" * 40 and r2e.base_commit == "1" * 40
    assert r2e.image.startswith("namanjain12/calc_final:") and r2e.problem_statement == "add() subtracts"
    assert r2e.fail_to_pass == ("r2e_tests/test_1.py::test_add",) and r2e.pass_to_pass == ("r2e_tests/test_1.py::test_zero",)
    assert r2e.patch == file_diff("calc.py", BAD, GOOD)  # rendered from the parsed commit
    assert "+++ b/r2e_tests/test_1.py" in r2e.test_patch and "def test_add" in r2e.test_patch


def test_unknown_fields_are_named_and_kept(mirrors, tmp_path):
    path = write_jsonl(tmp_path / "extra.jsonl", [{**swebench_row(mirrors["base"]), "stars": 12, "labels": ["bug"]}])
    loaded = load(str(path), "auto", mirrors["root"])
    assert loaded.unknown_fields == {"labels": 1, "stars": 1} and loaded.tasks[0].extra["stars"] == 12
    shown = invoke_cli("tasks", "stats", str(path), f"task.repos_dir={mirrors['root']}", "--no-env")
    assert shown.returncode == 0, shown.stderr
    assert "unknown fields   labels (1 rows), stars (1 rows)" in shown.stdout and "octo/calc" in shown.stdout


def test_parquet_rows_load_through_pyarrow(mirrors, tmp_path, monkeypatch):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = [swegym_row(mirrors["base"]), {**swegym_row(mirrors["base"]), "instance_id": "octo__calc-3"}]
    path = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    loaded = load(str(path), "auto", mirrors["root"])
    assert loaded.errors == [] and [t.instance_id for t in loaded.tasks] == ["octo__calc-2", "octo__calc-3"]
    assert loaded.tasks[1].fail_to_pass == tuple(F2P)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(TaskFileError, match=r"pyarrow, which is not installed: pip install 'slimecli\[datasets\]'"):
        load(str(path))


def test_a_malformed_row_is_a_config_error_with_file_line_field(mirrors, tmp_path):
    bad_r2e = {**r2egym_row(), "expected_output_json": "{not json"}
    path = write_jsonl(tmp_path / "bad.jsonl", [swebench_row(mirrors["base"]), {**swesmith_row(), "FAIL_TO_PASS": 7},
                                                bad_r2e, {"question": "what?"}])
    proc = invoke_cli("config", "validate", "task=swe", f"task.path={path}", f"task.repos_dir={mirrors['root']}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{path}:2: FAIL_TO_PASS: expected a list of non-empty test id strings, got int" in proc.stderr
    assert f"{path}:3: expected_output_json: not valid JSON" in proc.stderr
    assert f"{path}:4: <row>: no known layout has these fields (question); set task.format" in proc.stderr
    missing = invoke_cli("config", "validate", "task=swe", f"task.path={path}", f"task.repos_dir={tmp_path / 'nope'}")
    assert missing.returncode == 2 and "task.repos_dir" in missing.stderr and "no such directory" in missing.stderr
    no_mirror = load(str(write_jsonl(tmp_path / "m.jsonl", [swebench_row(mirrors["base"])])), "swebench", str(tmp_path))
    assert [e.render() for e in no_mirror.errors] == [
        f"{tmp_path / 'm.jsonl'}:1: repo: no mirror of 'octo/calc' under task.repos_dir={tmp_path} "
        "(looked for owner__name, owner/name and name)"]


def test_reverse_patch_undoes_a_multi_hunk_diff():
    old = "".join(f"line {i}\n" for i in range(40))
    new = old.replace("line 3\n", "line three\n").replace("line 30\n", "").replace("line 35\n", "line 35\nextra\n")
    assert reverse_patch(file_diff("f.txt", old, new)) == file_diff("f.txt", new, old)


@pytest.mark.slow
def test_a_mapped_swesmith_row_grades_in_its_mirror(mirrors, tmp_path):
    """`tasks check` on a SWE-smith row as published: the bug reversed into the gold patch, the instance's branch
    in the mirror (the layout whose mapping does the most; the others' mapped fields are compared above)."""
    path = write_jsonl(tmp_path / "published.jsonl", [swesmith_row()])
    proc = invoke_cli("tasks", "check", f"task.path={path}", f"task.repos_dir={mirrors['root']}",
                      "task.environment=host", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [result] = [json.loads(line) for line in proc.stdout.splitlines()]
    assert result["ok"] and {c["name"] for c in result["checks"]} >= {"base", "gold", "empty_diff", "delete_tests"}
