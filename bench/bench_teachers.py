"""Two teachers in one run: each sample is scored by the teacher its source routes it to, and the per-teacher KL
(teacher/<name>/kl: the student's minus the teacher's log-prob per trained token) falls for both.

The student is the tiny model; teacher `sharp` is the student made sharper (its final norm x SCALE: the same
preferences, surer), teacher `other` another random tiny model as sharp. Prompts of source `left` go to `sharp`,
of `right` to `other`. Prints each teacher's KL over the first and last WINDOW steps and their ratio, and checks
every dumped sample's teacher against its source's route.

  python bench/bench_teachers.py [--steps 30] [--scale 8]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ROUTES = {"left": "sharp", "right": "other"}
WORDS = ["apple", "river", "stone", "cloud", "green", "music", "paper", "light"]


def sharpened(src: Path, dst: Path, scale: float) -> Path:
    """A copy of a tiny checkpoint whose final norm is scaled: logits x scale, the same ranking, a surer model."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst, dirs_exist_ok=True)
    weights = load_file(str(src / "model.safetensors"))
    weights["model.norm.weight"] = weights["model.norm.weight"] * scale
    save_file(weights, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def make_models(root: Path, scale: float) -> tuple[Path, Path, Path]:
    from slimecli.model.tiny import create_tiny_model

    student = create_tiny_model(root / "student", seed=0)
    sharp = sharpened(student, root / "sharp", scale)
    other = sharpened(create_tiny_model(root / "other-raw", seed=2), root / "other", scale)
    return student, sharp, other


def write_rows(path: Path, n: int = 64) -> Path:
    """Prompts of two sources, told apart by their first word and by the row's `source`."""
    with open(path, "w") as f:
        for i in range(n):
            source = "left" if i % 2 == 0 else "right"
            f.write(json.dumps({"prompt": f"{source}: say {WORDS[i % len(WORDS)]} {i}", "label": WORDS[i % len(WORDS)],
                                "source": source}) + "\n")
    return path


def overrides(root: Path, student: Path, sharp: Path, other: Path, rows: Path, steps: int) -> list[str]:
    return ["+recipe=opd", f"model.path={student}", "task=jsonl", f"task.path={rows}", "reward=exact_match",
            f"teachers=[{{name: sharp, model_path: '{sharp}'}}, {{name: other, model_path: '{other}'}}]",
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--scale", type=float, default=8.0)
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--dir", default=None, help="keep the run here (default: a temporary directory)")
    args = parser.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="bench-teachers-"))
    student, sharp, other = make_models(root, args.scale)
    rows = write_rows(root / "rows.jsonl")
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "slimecli", "train",
                          *overrides(root, student, sharp, other, rows, args.steps)],
                         cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"train failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    run = root / "run"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    print(f"{args.steps} steps in {time.perf_counter() - started:.0f}s; {check_routes(run)} samples, each scored "
          f"by its source's teacher ({ROUTES})")
    for name in ROUTES.values():
        kl = [r[f"teacher/{name}/kl"] for r in metrics if f"teacher/{name}/kl" in r]
        w = min(args.window, len(kl) // 2)
        first, last = sum(kl[:w]) / w, sum(kl[-w:]) / w
        print(f"teacher/{name}/kl: first {w} steps {first:.4f}, last {w} {last:.4f}, last/first {last / first:.3f}")


if __name__ == "__main__":
    main()
