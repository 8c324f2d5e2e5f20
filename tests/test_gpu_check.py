"""bench/gpu_check.sh is run the first time a GPU is available; where none is, it must fail loudly at once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

SCRIPT = ROOT / "bench" / "gpu_check.sh"


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([shutil.which("bash") or "/bin/bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.skipif(os.path.exists("/dev/nvidia0"), reason="this machine has a GPU")
def test_no_nvidia_smi_is_a_clear_failure(tmp_path: Path) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("dirname", "timeout", "env"):
        (bare / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    proc = run({"PATH": str(bare), "HOME": str(tmp_path)})
    assert proc.returncode == 1
    assert "nvidia-smi not found" in proc.stderr


@pytest.mark.skipif(os.path.exists("/dev/nvidia0"), reason="this machine has a GPU")
def test_a_torch_without_cuda_is_a_clear_failure(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: pretend'\n")
    (fake / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "SKIP_SETUP": "1", "PYTHON": sys.executable}
    proc = run(env)
    assert proc.returncode == 1
    assert "CUDA build of PyTorch" in proc.stderr
    direct = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py")], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert direct.returncode == 1 and "GPU CHECK FAILED" in direct.stderr and "Traceback" not in direct.stderr


def _fake_nvidia_smi(tmp_path: Path, script: str) -> dict[str, str]:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text(f"#!/bin/sh\n{script}\n")
    (fake / "nvidia-smi").chmod(0o755)
    return {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "PYTHON": sys.executable,
            "VENV": str(tmp_path / "venv")}


@pytest.mark.skipif(os.path.exists("/dev/nvidia0"), reason="this machine has a GPU")
def test_offline_stops_at_once_without_a_gpu_and_installs_nothing(tmp_path: Path) -> None:
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    (wheelhouse / "slimecli-0.1.0-py3-none-any.whl").write_bytes(b"")
    (wheelhouse / "requirements.txt").write_text("rich==15.0.0\n")
    no_gpu = _fake_nvidia_smi(tmp_path, "echo 'No devices were found'; exit 6")
    proc = run(no_gpu, "--offline", str(wheelhouse))
    assert proc.returncode == 1 and "no GPU here: nvidia-smi sees no GPU" in proc.stderr
    assert not (tmp_path / "venv").exists()
    # a GPU, but the machine's torch has no CUDA: said before any venv is made
    (tmp_path / "bin" / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: pretend'\n")
    proc = run(no_gpu, "--offline", str(wheelhouse))
    assert proc.returncode == 1 and "reuses the machine's CUDA PyTorch" in proc.stderr
    assert not (tmp_path / "venv").exists()
    # an empty or missing wheelhouse, and no directory at all
    proc = run(no_gpu, "--offline", str(tmp_path / "none"))
    assert proc.returncode == 1 and "holds no slimecli wheel and requirements.txt: make wheelhouse first" in proc.stderr
    proc = run(no_gpu, "--offline")
    assert proc.returncode == 1 and "--offline needs the wheelhouse directory" in proc.stderr
