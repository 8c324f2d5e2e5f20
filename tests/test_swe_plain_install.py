"""A plain install grades: `slimecli tasks check` run by an interpreter that cannot import pytest passes a
built-in task, the test runner coming from a runner venv slimecli builds (pip, from the package registry).

The interpreter is a venv holding links to this one's packages, pytest and its plugins left out: no download.
The whole path (a fresh venv, a non-editable `pip install .` with no extras, all 20 tasks) is
bench/check_plain_install.py; one task here keeps CI cheap."""

from __future__ import annotations

import subprocess

import pytest

from tests.helpers import ROOT
from tests.helpers.plain_venv import linked_venv

pytestmark = pytest.mark.slow

RUNNER_PARTS = ("pytest", "_pytest", "xdist", "pytest_", "_hypothesis_pytestplugin")


def test_tasks_check_passes_where_slimecli_cannot_import_pytest(tmp_path):
    python = linked_venv(tmp_path / "plain", RUNNER_PARTS)  # this venv's packages, pytest and its plugins left out
    probe = subprocess.run([str(python), "-c", "import slimecli, pip; import pytest"], capture_output=True, text=True)
    assert "No module named 'pytest'" in probe.stderr  # slimecli and pip import, pytest does not
    envs = tmp_path / "envs"
    proc = subprocess.run([str(python), "-m", "slimecli", "tasks", "check", "task.path=builtin:swe_tiny",
                           "task.instance=tiny-calc-001", f"task.env_dir={envs}"], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    if "1/1 tasks valid" not in proc.stderr and "env:install" in proc.stdout:
        reach = subprocess.run([str(python), "-m", "pip", "download", "--no-deps", "-q", "-d", str(tmp_path / "dl"),
                                "pytest"], capture_output=True, text=True, timeout=300)
        if reach.returncode != 0:
            pytest.skip(f"the package registry cannot be reached for the runner venv: {reach.stderr[-300:]}")
    assert proc.returncode == 0 and "1/1 tasks valid" in proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]
    listed = subprocess.run([str(python), "-m", "slimecli", "tasks", "env", "list", f"task.env_dir={envs}"],
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert listed.returncode == 0 and listed.stdout.startswith("runner-") and "pytest" in listed.stdout, listed
