"""`make wheelhouse`: the wheels a GPU machine without a network needs to run bench/gpu_check.sh --offline.

The dependencies of slimecli[megatron] at the versions constraints.txt pins, for Python 3.11 and 3.12 on
manylinux x86_64, binary wheels only (nothing is built on the GPU machine), plus slimecli's own wheel and a
requirements.txt naming them. Left out, because a machine with a CUDA PyTorch and transformers already has them
(the venv sees them through its system site packages) and together they are 57 MiB: torch, transformers and what
either requires (numpy alone is 16 MiB per Python). Left out as well, because the check never draws a report:
`slimecli report`'s plotting stack (matplotlib, pillow, fonttools, ...: 46 MiB). `--all` keeps everything
(about 150 MiB). Fails when the directory grows past the limit (60 MiB), so that it stays cheap to carry.

    python bench/wheelhouse.py [--out wheelhouse] [--python 3.11 3.12] [--limit-mib 60] [--all]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# torch, slimecli itself (built here), and what only torch requires: always left out
SKIP = {"torch", "slimecli", "sympy", "mpmath", "networkx", "triton", "setuptools"}
# what a machine with a CUDA PyTorch and transformers has: their own requirements
MACHINE = {"transformers", "tokenizers", "safetensors", "huggingface-hub", "hf-xet", "numpy", "pyyaml", "regex",
           "tqdm", "filelock", "fsspec", "packaging", "typing-extensions", "jinja2", "markupsafe"}
# `slimecli report` only (imported when a report is drawn)
PLOTS = {"matplotlib", "pillow", "fonttools", "kiwisolver", "contourpy", "cycler", "pyparsing", "python-dateutil"}
# pure-Python packages published as sdists only (omegaconf pins antlr4 4.9.3): built into a wheel here
SDIST_ONLY = {"antlr4-python3-runtime"}
PLATFORMS = ["linux_x86_64", "manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64",
             *(f"manylinux_2_{minor}_x86_64" for minor in range(5, 35))]


def normal(name: str) -> str:
    return name.lower().replace("_", "-")


def resolved(constraints: Path, skip: set[str]) -> list[str]:
    """name==version of every package pip installs for slimecli[megatron] under the constraints."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
                        "--report", str(report), "-c", str(constraints), f"{ROOT}[megatron]"], check=True)
        packages = json.loads(report.read_text())["install"]
    pins = [(p["metadata"]["name"], p["metadata"]["version"]) for p in packages]
    return sorted(f"{name}=={version.split('+')[0]}" for name, version in pins if normal(name) not in skip)


def download(pins: list[str], out: Path, python: str) -> None:
    argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--dest", str(out),
            "--python-version", python, "--implementation", "cp"]
    for platform in PLATFORMS:
        argv += ["--platform", platform]
    subprocess.run([*argv, *(p for p in pins if normal(p.split("==")[0]) not in SDIST_ONLY)], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "wheelhouse")
    parser.add_argument("--python", nargs="+", default=["3.11", "3.12"])
    parser.add_argument("--constraints", type=Path, default=ROOT / "constraints.txt")
    parser.add_argument("--limit-mib", type=float, default=60.0)
    parser.add_argument("--all", action="store_true", help="keep transformers, numpy and the plotting stack too")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    pins = resolved(args.constraints, SKIP if args.all else SKIP | MACHINE | PLOTS)
    (args.out / "requirements.txt").write_text("\n".join(pins) + "\n")
    for python in args.python:
        download(pins, args.out, python)
    built = [p for p in pins if normal(p.split("==")[0]) in SDIST_ONLY]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(args.out), str(ROOT),
                    *built], check=True)
    wheels = sorted(args.out.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels) / 2**20
    largest = sorted(wheels, key=lambda w: w.stat().st_size, reverse=True)[:5]
    print(f"{args.out}: {len(wheels)} wheels, {size:.1f} MiB for Python {' and '.join(args.python)} "
          f"({len(pins)} packages; largest: "
          + ", ".join(f"{w.name} {w.stat().st_size / 2**20:.1f}" for w in largest) + ")")
    if size > args.limit_mib and not args.all:
        print(f"wheelhouse: {size:.1f} MiB is over the {args.limit_mib:g} MiB limit", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
