"""Wall time of `slimecli config show +recipe=swe_agent` against a bare Hydra compose of the same tree.

All run as fresh interpreters, interleaved, so machine noise hits each alike:
- bare: Hydra composes conf/ with the swe_agent recipe and prints the YAML (the baseline);
- slimecli: `config show` as a user runs it twice: the composition comes from the compose cache
  (slimecli/launch/compose_cache.py), then the schema, the rules and the pre-flight checks run as always;
- slimecli, cold: the same with SLIMECLI_COMPOSE_CACHE=off (what the first command after a change pays).
Each command runs once before timing, with bytecode caching on (a user's second command finds both its .pyc
files and the compose cache). Goal: slimecli / bare <= 1.2.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
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
SHOW = [sys.executable, "-m", "slimecli", "config", "show", "+recipe=swe_agent"]


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, cwd=ROOT, env=env)
    return time.perf_counter() - start


def main(rounds: int = 9) -> None:
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory(prefix="bench-config-") as cache:
        cases = {"bare hydra compose (same tree)": ([sys.executable, "-c", BARE], base),
                 "config show +recipe=swe_agent": (SHOW, {**base, "SLIMECLI_COMPOSE_CACHE": cache}),
                 "config show, compose cache off": (SHOW, {**base, "SLIMECLI_COMPOSE_CACHE": "off"})}
        times: dict[str, list[float]] = {name: [] for name in cases}
        for argv, env in cases.values():  # warm-up: .pyc files written, the compose cache filled
            timed(argv, env)
        for _ in range(rounds):
            for name, (argv, env) in cases.items():
                times[name].append(timed(argv, env))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    bare = med["bare hydra compose (same tree)"]
    for name, value in med.items():
        print(f"{name}: median {value * 1000:.0f} ms over {rounds} runs ({value / bare:.2f}x bare)")
    print(f"ratio slimecli/bare = {med['config show +recipe=swe_agent'] / bare:.2f} (goal <= 1.2); "
          f"with the cache off {med['config show, compose cache off'] / bare:.2f}")


if __name__ == "__main__":
    main()
