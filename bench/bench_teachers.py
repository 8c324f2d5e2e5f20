"""Two teachers in one run: each sample is scored by the teacher its source routes it to, and the per-teacher KL
(teacher/<name>/kl: the student's minus the teacher's log-prob per trained token) falls for both.

The student is the tiny model. Each teacher leans towards half of the vocabulary in every context (a bias of
+/-MARGIN on its output layer: tests/helpers/teacher.py), `low` towards the lower token ids, `even` towards the
even ones; prompts of source `left` go to `low`, of `right` to `even`. Prints each teacher's KL over the first
and last WINDOW steps and their ratio, and checks every dumped sample's teacher against its source's route.

  python bench/bench_teachers.py [--steps 24] [--margin 2]
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

from tests.helpers.teachers import ROUTES, check_routes, make_models, overrides, write_rows  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--margin", type=float, default=2.0)
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--dir", default=None, help="keep the run here (default: a temporary directory)")
    args = parser.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="bench-teachers-"))
    student, low, even = make_models(root, args.margin)
    rows = write_rows(root / "rows.jsonl")
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "slimecli", "train",
                          *overrides(root, student, low, even, rows, args.steps)],
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
