"""``python -m sglang.launch_server`` as slimecli launches it for rollout=sglang, served by slimecli's own engine
(which speaks SGLang's native API): --model-path on --host and --port, the other flags ignored. Like SGLang, a
restarted stand-in serves its --model-path at once: slimecli's own handshake (SLIMECLI_AWAIT_WEIGHTS) is dropped,
so the trainer has to notice the restart from the lost connections alone."""

from __future__ import annotations

import argparse
import os
import sys

parser = argparse.ArgumentParser(prog="sglang.launch_server")
parser.add_argument("--model-path", required=True)
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int, required=True)
args, _ignored = parser.parse_known_args()
os.environ.pop("SLIMECLI_AWAIT_WEIGHTS", None)
run_dir = os.path.join(os.environ.get("SLIMECLI_RUN_DIR", "."), f"sglang-standin-{args.port}")
model = [] if args.model_path == "<model=tiny>" else [f"model.path={args.model_path}"]
os.execv(sys.executable, [sys.executable, "-m", "slimecli", "rollout", "serve", *model, f"rollout.host={args.host}",
                          f"rollout.port={args.port}", f"run.dir={run_dir}"])
