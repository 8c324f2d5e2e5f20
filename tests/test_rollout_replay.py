"""rollout.dump, rollout.replay and `slimecli rollout reverify`: a run's samples on disk, trained on again with no
engine (the same losses), step by step from the run's checkpoints, and scored again with another reward."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

from slimecli.rollout.dump import FORMAT, read_step
from tests.helpers import invoke_cli
from tests.helpers.train_e2e import metrics, run_train

pytestmark = pytest.mark.slow

STEPS = 5
COMMON = ("trainer.nproc=1", f"trainer.max_steps={STEPS}", "eval.at_start=false", "eval.at_end=false",
          "trainer.save_interval=1", "trainer.keep_checkpoints=0")
SAME = ("train/loss", "train/pg_loss", "train/grad_norm", "train/entropy", "reward/mean")


@pytest.fixture(scope="module")
def dumped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("dump") / "run"
    out = run_train(run, *COMMON, "rollout.dump=true")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return run


def test_the_dump_holds_each_step_as_trained(dumped: Path):
    rows = metrics(dumped)
    for row in rows:
        step = read_step(dumped / "rollouts", row["step"])
        header = json.loads((dumped / "rollouts" / f"step_{row['step']}.jsonl").read_text().splitlines()[0])
        assert header["format"] == FORMAT and header["step"] == row["step"]
        assert len(step.samples) == len(step.train_rewards) == row["rollout/samples"]
        assert sum(step.train_rewards) / len(step.train_rewards) == pytest.approx(row["reward/mean"])
        s = step.samples[0]
        assert len(s.rollout_log_probs) == len(s.token_versions) == s.response_length > 0
        assert s.weight_versions and isinstance(s.metadata["position"], int) and s.response


def test_a_replay_trains_the_same_steps_without_an_engine(dumped: Path, tmp_path: Path):
    replay = tmp_path / "replay"
    out = run_train(replay, *COMMON, f"rollout.replay={dumped}")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert [p.name for p in (replay / "logs").iterdir()] == ["trainer.log"]  # no engine, no teacher started
    assert "replayed     the rollout dump" in out.stdout
    for a, b in zip(metrics(dumped), metrics(replay), strict=True):
        for key in SAME:
            assert b[key] == pytest.approx(a[key], abs=1e-6), (a["step"], key)
    first, second = load_file(dumped / "final" / "model.safetensors"), load_file(replay / "final" / "model.safetensors")
    assert all((first[k] - second[k]).abs().max() <= 1e-6 for k in first)


def test_chosen_steps_replay_from_the_checkpoint_before_them(dumped: Path, tmp_path: Path):
    out = run_train(tmp_path / "steps", *COMMON, f"rollout.replay={dumped}", "rollout.replay_steps=[3,5]")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    original = {r["step"]: r for r in metrics(dumped)}
    rows = metrics(tmp_path / "steps")
    assert [r["step"] for r in rows] == [3, 5]
    for row in rows:
        for key in SAME:
            assert row[key] == pytest.approx(original[row["step"]][key], abs=1e-6), (row["step"], key)
    assert not (tmp_path / "steps" / "checkpoints").exists() and not (tmp_path / "steps" / "final").exists()
    # dumps without the run's checkpoints: a later step cannot be replayed alone
    bare = tmp_path / "bare"
    shutil.copytree(dumped / "rollouts", bare)
    out = invoke_cli("config", "validate", *COMMON, f"rollout.replay={bare}", "rollout.replay_steps=[3]")
    assert out.returncode == 2 and "rollout.replay_steps" in out.stderr, out.stderr
    assert "checkpoint of step 2" in out.stderr and "Traceback" not in out.stderr
    out = invoke_cli("config", "validate", *COMMON, f"rollout.replay={dumped}", "trainer.max_steps=7")
    assert out.returncode == 2 and "has no dump of steps 6..7" in out.stderr, out.stderr
    out = invoke_cli("config", "validate", "rollout.replay_steps=[2]")
    assert out.returncode == 2 and "add rollout.replay=RUN" in out.stderr, out.stderr


def test_reverify_reports_the_samples_another_reward_scores_otherwise(dumped: Path):
    same = invoke_cli("rollout", "reverify", str(dumped))
    total = STEPS * 64  # quickstart: 8 prompts x 8 samples a step
    assert same.returncode == 0 and f"0 of {total} samples changed reward over {STEPS}" in same.stdout, same.stdout
    other = invoke_cli("rollout", "reverify", str(dumped), "reward=exact_match")
    assert other.returncode == 0, other.stderr
    changed = [line for line in other.stdout.splitlines() if line.startswith("step ")]
    assert changed and f"{len(changed)} of {total} samples changed reward" in other.stdout
    step, index = int(changed[0].split()[1]), int(changed[0].split()[3].rstrip(":"))
    before = next(s for s in read_step(dumped / "rollouts", step).samples if s.index == index)
    assert changed[0].endswith(f"{before.reward:g} -> 0") or changed[0].endswith(f"{before.reward:g} -> 1")
    missing = invoke_cli("rollout", "reverify", str(dumped / "nothing"))
    assert missing.returncode == 2 and "no rollout dump here" in missing.stderr
