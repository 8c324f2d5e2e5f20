"""The command line every regenerating tool shares: build the file's bytes, then write them to --out, or with
--check only say whether the shipped file already holds them (exit 1 when it does not, 2 when the build fails)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def regen_main(name: str, doc: str, out: Path, build: Callable[[], bytes], failure: type[Exception], source: str,
               argv: list[str] | None = None) -> int:
    """`python -m tools.NAME [--out FILE] [--check]`; `build` raises `failure` when its sources are inconsistent;
    `source` names what the file is made from, for the --check message."""
    parser = argparse.ArgumentParser(prog=f"python -m tools.{name}", description=doc.splitlines()[0])
    parser.add_argument("--out", type=Path, default=out, help="where to write the task file")
    parser.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = parser.parse_args(argv)
    try:
        data = build()
    except failure as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    if args.check:
        same = args.out.is_file() and args.out.read_bytes() == data
        print(f"{args.out}: {'up to date' if same else f'differs from {source} (regenerate it)'}", file=sys.stderr)
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(data)
    print(f"{args.out}: {len(data.splitlines())} tasks", file=sys.stderr)
    return 0
