"""Wall time of `slimecli config show +recipe=swe_agent` against a bare Hydra compose of the same tree.

Both run as fresh interpreters, interleaved, so machine noise hits both alike. Goal: ratio <= 1.5.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BARE = f"""
import os, tempfile, shutil
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
tmp = tempfile.mkdtemp()
os.symlink({str(ROOT / 'recipes')!r}, os.path.join(tmp, 'recipe'))
with initialize_config_dir(config_dir={str(ROOT / 'conf')!r}, version_base=None):
    cfg = compose(config_name='config', overrides=['hydra.searchpath=[file://' + tmp + ']', '+recipe=swe_agent'])
print(OmegaConf.to_yaml(cfg))
shutil.rmtree(tmp)
"""


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, cwd=ROOT)
    return time.perf_counter() - start


def main(rounds: int = 7) -> None:
    ours, bare = [], []
    for _ in range(rounds):
        ours.append(timed([sys.executable, "-m", "slimecli", "config", "show", "+recipe=swe_agent"]))
        bare.append(timed([sys.executable, "-c", BARE]))
    o, b = statistics.median(ours), statistics.median(bare)
    print(f"config show +recipe=swe_agent: median {o * 1000:.0f} ms over {rounds} runs")
    print(f"bare hydra compose (same tree): median {b * 1000:.0f} ms")
    print(f"ratio slimecli/bare = {o / b:.2f} (goal <= 1.5)")


if __name__ == "__main__":
    main()
