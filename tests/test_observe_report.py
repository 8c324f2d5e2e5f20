"""`slimecli report`: plots and report.html from a real short quickstart run, overlays labelled by the config
keys that differ, missing series skipped, a directory that is not a run refused with exit 2."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from slimecli.observe.report import write_report
from slimecli.observe.runs import differing_keys, group_runs, label_runs, load_run
from tests.helpers import ROOT, invoke_cli
from tests.helpers.train_e2e import QUICKSTART_STEPS, metrics, quickstart_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STEPS = QUICKSTART_STEPS


def assert_valid_pngs(out: Path) -> list[str]:
    """Every PNG in ``out`` has the PNG signature and decodes to a non-empty RGB(A) image; their names."""
    import matplotlib.image as mpimg

    names = sorted(p.name for p in out.glob("*.png"))
    assert names, f"no plots in {out}"
    for name in names:
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC, name
        image = mpimg.imread(out / name)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100 and image.shape[2] in (3, 4), name
    return names


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def series_of(out: Path) -> dict[str, dict[str, list[str]]]:
    return {p["file"]: p["series"] for p in manifest(out)["plots"]}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real quickstart run; `train` writes its report at the end."""
    path, stdout = quickstart_run(tmp_path_factory)
    assert f"report {path / 'report' / 'report.html'}" in stdout.replace("\n", " ") or \
        str(path / "report" / "report.html") in stdout, stdout[-2000:]
    assert len(metrics(path)) == STEPS
    return path


@pytest.mark.slow
def test_train_writes_a_report_whose_plots_are_valid_pngs_with_the_expected_series(run_dir: Path) -> None:
    out = run_dir / "report"
    names = assert_valid_pngs(out)
    drawn = series_of(out)
    assert sorted(drawn) == names  # the manifest lists exactly the plots on disk
    for file, keys in {"reward.png": ["reward/mean"], "loss.png": ["train/loss", "train/pg_loss"],
                       "kl.png": ["train/ppo_kl"], "entropy.png": ["train/entropy"],
                       "clipfrac.png": ["train/pg_clipfrac"], "grad_norm.png": ["train/grad_norm"],
                       "response_len.png": ["rollout/response_len_mean"],
                       "time.png": ["time/rollout_s", "time/update_s", "time/sync_weights_s"]}.items():
        assert file in drawn, f"{file} not drawn: {sorted(drawn)}"
        for key in keys:
            assert drawn[file].get(key) == [run_dir.name], (file, key, drawn[file])  # labelled by the run
    rows = metrics(run_dir)
    eval_rewards = sorted({k for r in rows for k in r if k.startswith("eval/") and k.endswith("/reward_mean")})
    assert eval_rewards == ["eval/heldout/reward_mean"]  # the quickstart evaluates its held-out set
    assert "eval/heldout/reward_mean" in drawn["eval.png"], drawn.get("eval.png")
    assert drawn["time.png"].get("time/eval_s") == [run_dir.name]  # the step-time split includes evaluation
    page = (out / "report.html").read_text()
    for name in names:
        assert f'src="{name}"' in page
    command = (run_dir / "command.txt").read_text().strip()
    assert f"trainer.max_steps={STEPS}" in command and f"trainer.max_steps={STEPS}" in page
    assert "optimizer:" in page and "reward/mean" in page  # the resolved config and the final metrics


@pytest.mark.slow
def test_report_command_rerenders_without_importing_torch(run_dir: Path, tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from slimecli.cli.app import app\n"
        f"try:\n    app(['report', {str(run_dir)!r}, '--out', {str(tmp_path / 'again')!r}])\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "print('NO_TORCH')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert "NO_TORCH" in out.stdout, out.stderr[-3000:]
    assert f"report: {tmp_path / 'again' / 'report.html'}" in out.stdout
    assert sorted(series_of(tmp_path / "again")) == sorted(series_of(run_dir / "report"))


@pytest.mark.slow
def test_overlay_of_two_runs_is_labelled_by_the_differing_key(run_dir: Path, tmp_path: Path) -> None:
    """A copy of the run with another optimizer.name (and other ports and directory, which are no label)."""
    other = tmp_path / "other"
    other.mkdir()
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["optimizer"]["name"] = "stateless_adam"
    config["rollout"]["port"] = 1
    config["run"]["dir"] = str(other)
    (other / "config.yaml").write_text(yaml.safe_dump(config))
    shutil.copy(run_dir / "metrics.jsonl", other / "metrics.jsonl")
    out = invoke_cli("report", str(run_dir), str(other), "--out", str(tmp_path / "cmp"))
    assert out.returncode == 0, out.stderr
    labels = ["optimizer.name=adam", "optimizer.name=stateless_adam"]
    assert [g["label"] for g in manifest(tmp_path / "cmp")["groups"]] == labels
    assert manifest(tmp_path / "cmp")["differing_keys"] == ["optimizer.name"]
    drawn = series_of(tmp_path / "cmp")
    assert drawn["reward.png"]["reward/mean"] == labels and drawn["time.png"]["time/step_s"] == labels
    assert_valid_pngs(tmp_path / "cmp")
    assert "optimizer.name=stateless_adam" in (tmp_path / "cmp" / "report.html").read_text()


def fake_run(path: Path, config: dict, rows: list[dict]) -> Path:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    (path / "command.txt").write_text("slimecli train\n")
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def config(optimizer: str = "adam", seed: int = 1, port: int = 30000) -> dict:
    return {"run": {"seed": seed, "dir": None, "name": "quickstart"}, "optimizer": {"name": optimizer, "lr": 0.005},
            "rollout": {"port": port}, "cluster": {"master_port": port + 1}}


def rows(n: int, offset: float = 0.0) -> list[dict]:
    return [{"step": s, "reward/mean": min(1.0, offset + s / n), "reward/std": 0.1, "time/step_s": 0.5,
             "time/rollout_s": 0.3, "time/update_s": 0.2} for s in range(1, n + 1)]


def test_seeds_are_one_line_with_a_band_or_a_line_each(tmp_path: Path) -> None:
    runs = [fake_run(tmp_path / f"{opt}-{seed}", config(opt, seed, 30000 + seed), rows(10, seed / 100))
            for opt in ("adam", "stateless_adam") for seed in (1, 2, 3)]
    page = write_report(runs, tmp_path / "band")
    groups = manifest(tmp_path / "band")["groups"]
    assert [g["label"] for g in groups] == ["optimizer.name=adam (3 runs)", "optimizer.name=stateless_adam (3 runs)"]
    assert groups[0]["summary"]["steps_to_threshold"] == pytest.approx(8.0)
    assert page.is_file() and series_of(tmp_path / "band")["reward.png"]["reward/mean"] == [g["label"] for g in groups]
    write_report(runs, tmp_path / "lines", seeds="lines")
    assert [g["label"] for g in manifest(tmp_path / "lines")["groups"]][:2] == [
        "optimizer.name=adam, seed=1", "optimizer.name=adam, seed=2"]
    assert_valid_pngs(tmp_path / "lines")


def test_labels_ignore_ports_and_directories_and_fall_back_to_names(tmp_path: Path) -> None:
    a = load_run(fake_run(tmp_path / "a", config(port=1), rows(3)))
    b = load_run(fake_run(tmp_path / "b", config(port=2), rows(3)))
    assert differing_keys([a.config, b.config]) == []
    assert label_runs([a, b]) == ["a", "b"]  # the same config and seed: told apart by directory
    c = load_run(fake_run(tmp_path / "c", {**config(seed=9), "trainer": {"max_steps": 5}}, rows(3)))
    assert differing_keys([a.config, c.config]) == ["trainer.max_steps"]
    assert [g.display for g in group_runs([a, c])] == ["trainer.max_steps=null", "trainer.max_steps=5"]


def test_missing_series_are_skipped(tmp_path: Path) -> None:
    only_reward = fake_run(tmp_path / "r", config(), [{"step": s, "reward/mean": 0.1 * s} for s in (1, 2)])
    write_report([only_reward])
    assert sorted(series_of(only_reward / "report")) == ["reward.png"]
    assert_valid_pngs(only_reward / "report")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.yaml").write_text(yaml.safe_dump(config()))  # a run killed before its first step
    page = write_report([empty])
    assert manifest(empty / "report")["plots"] == [] and "no metrics" in page.read_text()


def test_a_directory_that_is_not_a_run_is_exit_2(tmp_path: Path) -> None:
    out = invoke_cli("report", str(tmp_path))
    assert out.returncode == 2 and "is not a run directory" in out.stderr and "Traceback" not in out.stderr
    out = invoke_cli("report", str(tmp_path / "missing"))
    assert out.returncode == 2 and "no such directory" in out.stderr
    good = fake_run(tmp_path / "good", config(), rows(2))
    out = invoke_cli("report", str(good), str(tmp_path / "missing"))  # nothing is written when one is bad
    assert out.returncode == 2 and not (good / "report").exists()
    out = invoke_cli("report", str(good), "--seeds", "cloud")
    assert out.returncode == 2 and "--seeds" in out.stderr


def test_help_and_config_show_import_neither_matplotlib_nor_wandb() -> None:
    code = (
        "import sys\n"
        "from slimecli.cli.app import app\n"
        "for argv in (['--help'], ['report', '--help'], ['config', 'show']):\n"
        "    try:\n        app(argv)\n    except SystemExit as e:\n        assert not e.code, (argv, e.code)\n"
        "assert not {'matplotlib', 'wandb', 'torch'} & set(sys.modules), 'a heavy module was imported'\n"
        "print('LIGHT')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "LIGHT" in out.stdout, out.stderr[-3000:]


def test_observe_keys_are_config_keys() -> None:
    out = invoke_cli("config", "show", "observe.wandb=true", "observe.wandb_project=p", "observe.report=false")
    assert out.returncode == 0 and "wandb: true" in out.stdout and "report: false" in out.stdout, out.stderr
    out = invoke_cli("config", "show", "observe.reprot=false")
    assert out.returncode == 2 and "did you mean 'observe.report'" in out.stderr


def test_a_label_tells_every_two_configs_apart_and_by_picks_the_keys(tmp_path: Path) -> None:
    def cfg(opt: str, lr: float) -> dict:
        c = config(opt)
        c["optimizer"]["lr"] = lr
        return c

    runs = [load_run(fake_run(tmp_path / n, cfg(o, lr), rows(3)))
            for n, o, lr in (("a1", "adam", 1.0), ("a2", "adam", 2.0), ("s1", "stateless_adam", 1.0))]
    # optimizer.name alone would put both adam runs on one line
    assert label_runs(runs) == ["optimizer.name=adam, optimizer.lr=1", "optimizer.name=adam, optimizer.lr=2",
                                "optimizer.name=stateless_adam, optimizer.lr=1"]
    assert label_runs(runs[1:]) == ["optimizer.name=adam", "optimizer.name=stateless_adam"]
    groups = group_runs(runs, by=["optimizer.name"])
    assert [(g.display, len(g.runs)) for g in groups] == [("optimizer.name=adam (2 runs)", 2),
                                                          ("optimizer.name=stateless_adam", 1)]
    out = invoke_cli("report", *(str(r.path) for r in runs), "--by", "optimizer.lr", "--out", str(tmp_path / "by"))
    assert out.returncode == 0, out.stderr
    assert [g["label"] for g in manifest(tmp_path / "by")["groups"]] == ["optimizer.lr=1 (2 runs)", "optimizer.lr=2"]
