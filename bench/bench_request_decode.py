"""What checking a request costs next to parsing its JSON, for the engine's and the teacher's bodies.

Every /generate body goes through the one decoder (slimecli/config/decode.py) after the server's JSON parser.
This times both on the same bytes, alternating them so both see the same machine load, and prints the decode
time as a ratio of the JSON parse (goal: well under 1 for long prompts, where the token list dominates).

    python bench/bench_request_decode.py [--reps 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slimecli.engine.protocol import parse_generate  # noqa: E402
from slimecli.teacher.protocol import parse_generate as parse_teacher  # noqa: E402

VOCAB = 151_936
SAMPLING = {"max_new_tokens": 512, "temperature": 0.7, "top_p": 0.95, "top_k": 50, "stop": ["</s>"],
            "stop_token_ids": [151643, 151645], "sampling_seed": 7}


def bodies() -> dict[str, tuple[bytes, Callable[[Any], Any]]]:
    def engine(body: Any) -> Any:
        return parse_generate(body, VOCAB)

    def teacher(body: Any) -> Any:
        return parse_teacher(body, VOCAB, 0, 1.0)

    prompt = [(i * 7919) % VOCAB for i in range(32_768)]
    return {
        "engine, 16-token prompt": (json.dumps({"input_ids": prompt[:16], "sampling_params": SAMPLING,
                                                "return_logprob": True}).encode(), engine),
        "engine, 32k-token prompt": (json.dumps({"input_ids": prompt, "sampling_params": SAMPLING,
                                                 "return_logprob": True}).encode(), engine),
        "engine, batch of 64 x 512": (json.dumps({"input_ids": [prompt[i:i + 512] for i in range(64)],
                                                  "sampling_params": [SAMPLING] * 64,
                                                  "return_logprob": [True] * 64}).encode(), engine),
        "teacher, 8k tokens + labels": (json.dumps({"input_ids": prompt[:8192], "label_token_ids":
                                                    [[t] for t in prompt[1:8192]]}).encode(), teacher),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    print(f"{'body':32} {'json ms':>9} {'decode ms':>10} {'decode/json':>12}")
    for name, (raw, parse) in bodies().items():
        loads, checks = [], []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            body = json.loads(raw)
            t1 = time.perf_counter()
            parse(body)
            t2 = time.perf_counter()
            loads.append(t1 - t0)
            checks.append(t2 - t1)
        j, d = statistics.median(loads) * 1e3, statistics.median(checks) * 1e3
        print(f"{name:32} {j:9.3f} {d:10.3f} {d / j:12.2f}")


if __name__ == "__main__":
    main()
