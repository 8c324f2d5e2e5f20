"""`pip install .` (not editable) ships the config tree: commands work from any directory."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

from tests.helpers import ROOT


def test_wheel_ships_conf_and_recipes_and_runs_elsewhere(tmp_path):
    wheel_dir, target, elsewhere = tmp_path / "wheel", tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheel_dir), str(ROOT)], check=True, capture_output=True)
    (wheel,) = wheel_dir.glob("slimecli-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "slimecli/_conf/config.yaml" in names and "slimecli/_conf/optimizer/stateless_adam.yaml" in names
    assert {"slimecli/_recipes/quickstart.yaml", "slimecli/_recipes/opd.yaml", "slimecli/_recipes/swe_agent.yaml"} <= set(names)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = "import slimecli, sys; print(slimecli.__file__); sys.argv[0] = 'slimecli'; from slimecli.cli.app import main; main()"
    out = subprocess.run([sys.executable, "-c", code, "recipes", "list"], capture_output=True, text=True,
                         cwd=elsewhere, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].startswith(str(target))  # the installed copy, not the checkout
    assert {"quickstart", "opd", "swe_agent"} <= {line.split()[0] for line in out.stdout.splitlines()[1:]}
    shown = subprocess.run([sys.executable, "-c", code, "config", "show", "+recipe=swe_agent"], capture_output=True,
                           text=True, cwd=elsewhere, env=env)
    assert shown.returncode == 0 and "name: claude_code" in shown.stdout
