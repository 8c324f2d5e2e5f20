"""A run with two teachers on two sources (tests/test_teachers_e2e.py, bench/bench_teachers.py): a tiny student,
two teachers that each lean towards half of its vocabulary, JSONL prompts of two sources and the routes between
them, and the check that each dumped sample was scored by its source's teacher."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.teacher import biased_teacher

ROUTES = {"left": "low", "right": "even"}
WORDS = ["apple", "river", "stone", "cloud", "green", "music", "paper", "light"]


def make_models(root: Path, margin: float) -> tuple[Path, Path, Path]:
    from slimecli.model.tiny import create_tiny_model

    student = create_tiny_model(root / "student", seed=0)
    vocab = json.loads((student / "config.json").read_text())["vocab_size"]
    low = biased_teacher(student, root / "low", lambda i: i < vocab // 2, margin, seed=1)
    even = biased_teacher(student, root / "even", lambda i: i % 2 == 0, margin, seed=2)
    return student, low, even


def write_rows(path: Path, n: int = 64) -> Path:
    """Prompts of two sources, told apart by their first word and by the row's `source`."""
    with open(path, "w") as f:
        for i in range(n):
            source = "left" if i % 2 == 0 else "right"
            f.write(json.dumps({"prompt": f"{source}: say {WORDS[i % len(WORDS)]} {i}", "label": WORDS[i % len(WORDS)],
                                "source": source}) + "\n")
    return path


def overrides(root: Path, student: Path, low: Path, even: Path, rows: Path, steps: int) -> list[str]:
    return ["+recipe=opd", f"model.path={student}", "task=jsonl", f"task.path={rows}", "reward=exact_match",
            f"teachers=[{{name: low, model_path: '{low}'}}, {{name: even, model_path: '{even}'}}]",
            "teacher_routes={" + ", ".join(f"{k}: {v}" for k, v in ROUTES.items()) + "}",
            "trainer.nproc=1", f"trainer.max_steps={steps}", "trainer.save_interval=0", "eval.at_start=false",
            "eval.at_end=false", "rollout.dump=true", "observe.report=false", f"run.dir={root / 'run'}"]


def check_routes(run: Path) -> int:
    """Every dumped sample's teacher is its source's route; returns how many samples were checked."""
    n = 0
    for path in sorted((run / "rollouts").glob("step_*.jsonl")):
        for line in path.read_text().splitlines()[1:]:  # after the step's header
            sample = json.loads(line)
            source = sample["metadata"]["source"]
            assert sample["teacher"] == ROUTES[source], (path.name, source, sample["teacher"])
            n += 1
    return n
