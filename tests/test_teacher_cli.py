"""`slimecli teacher serve` refuses what it cannot serve before starting any rank."""

from __future__ import annotations

from tests.helpers import run_cli


def test_serve_needs_a_checkpoint_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    r = run_cli("teacher", "serve", f"teacher.model_path={tmp_path / 'empty'}", f"run.dir={tmp_path / 'run'}")
    assert r.returncode == 2
    assert f"teacher.model_path: not a Hugging Face checkpoint (no config.json) (got '{tmp_path / 'empty'}')" \
        in r.stderr
    assert not (tmp_path / "run").exists()
    r = run_cli("teacher", "serve", f"model.path={tmp_path / 'nope'}", f"run.dir={tmp_path / 'run'}")
    assert r.returncode == 2 and str(tmp_path / "nope") in r.stderr


def test_serve_reports_config_errors(tmp_path):
    r = run_cli("teacher", "serve", "teacher.tp=0", "teacher.sample_chunk_size=-1", f"model.path={tmp_path}")
    assert r.returncode == 2
    assert "teacher.tp" in r.stderr and "teacher.sample_chunk_size" in r.stderr


def test_teacher_help_lists_serve():
    r = run_cli("teacher", "--help")
    assert r.returncode == 0 and "serve" in r.stdout


def test_server_fields_are_validated():
    r = run_cli("config", "validate", "teacher.dtype=int8", "teacher.keepalive_s=0", "teacher.log_interval_s=-1")
    assert r.returncode == 2
    for key in ("teacher.dtype", "teacher.keepalive_s", "teacher.log_interval_s"):
        assert key in r.stderr
