"""Jump-forward over grammar-forced tokens, on the smoke recipe's workload: the engine's cost of one step's
constrained first turns, with jump-forward and without, side by side in this run.

Each of `--runs` requests (the smoke recipe's 8 runs of a step) gets the same long prompt (a CLI's system
prompt is thousands of tokens) and must write exactly one of a builtin:swe_tiny_smoke task's 3 listed edits
as a tool call (agent.constrain=choices), sampled at T=1. Without jump-forward every token of the chosen edit
(~270) is a decode step; with it, only the tokens where the edits part are. Reports wall and CPU seconds
(all threads of this process) per step and their ratios, over interleaved repetitions.

    python bench/bench_jump_forward.py [--prompt-tokens 4000 --runs 8 --reps 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def edits_grammar(tokenizer: object) -> str:
    """The choices grammar of the smoke recipe's first turn for its first task (Claude Code's Bash calls)."""
    from slimecli.agent.registry import resolve
    from slimecli.model.tool_calls import HermesToolParser
    from slimecli.model.tool_grammar import choices_grammar, resolve_choices
    from slimecli.swe.builtin import task_file

    row = json.loads(task_file("swe_tiny_smoke").read_text().splitlines()[0])
    harness = resolve("claude_code")[1]
    texts = resolve_choices([harness.shell_call(c["shell"]) for c in row["choices"]], HermesToolParser.call_format)
    return choices_grammar(texts, tokenizer.get_added_vocab())  # type: ignore[attr-defined]


def one_step(model: object, tok: object, model_dir: Path, prompt: list[int], grammar: str, runs: int,
             jump: bool) -> tuple[float, float, int, int]:
    """(wall s, CPU s, decode steps, output tokens) of `runs` constrained requests served together."""
    from slimecli.engine.grammar import GrammarCache
    from slimecli.engine.protocol import Constraint, parse_generate
    from slimecli.engine.scheduler import Scheduler
    from slimecli.engine.seq import Seq
    from slimecli.model.loading import load_tokenizer

    eos = frozenset({int(tok.eos_token_id)})  # type: ignore[attr-defined]
    vocab = int(model.config.vocab_size)  # type: ignore[attr-defined]
    compiled = GrammarCache(lambda: load_tokenizer(model_dir), vocab, eos).compile(Constraint("ebnf", grammar))
    seqs = []
    for i in range(runs):
        body = {"input_ids": prompt, "sampling_params": {"ebnf": grammar, "temperature": 1.0,
                                                         "max_new_tokens": 2048, "sampling_seed": i}}
        item = parse_generate(body, vocab).items[0]
        seqs.append(Seq(item=item, prompt_ids=list(prompt), eos_ids=eos, grammar=compiled.matcher()))
    done = threading.Event()
    sched = Scheduler(model, tok, pad_id=int(tok.eos_token_id), seed=0, jump_forward=jump,  # type: ignore[attr-defined]
                      dispatch=lambda _: done.set() if all(s.done for s in seqs) else None)
    sched.start()
    wall, cpu = time.perf_counter(), time.process_time()
    sched.submit(seqs)
    done.wait(600)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    sched.stop()
    assert all(s.finish and s.finish["type"] == "stop" for s in seqs), [s.finish for s in seqs]
    return wall, cpu, int(sched.stats["steps"]), sum(len(s.output_ids) for s in seqs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-tokens", type=int, default=4000)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    import torch

    from slimecli.config.groups.model import ModelConfig
    from slimecli.model.loading import load_model, load_tokenizer, resolve_model_path

    torch.set_num_threads(1)
    model_dir = Path(resolve_model_path(ModelConfig()))
    tok = load_tokenizer(model_dir)
    model = load_model(model_dir, "float32", "cpu")
    text = (ROOT / "README.md").read_text()
    ids: list[int] = []
    while len(ids) < args.prompt_tokens:
        ids += tok.encode(text, add_special_tokens=False)
    prompt = ids[:args.prompt_tokens]
    grammar = edits_grammar(tok)
    results: dict[bool, list[tuple[float, float, int, int]]] = {False: [], True: []}
    one_step(model, tok, model_dir, prompt[:64], grammar, 2, True)  # warm-up: kernels, grammar library
    for _ in range(args.reps):
        for jump in (False, True):
            results[jump].append(one_step(model, tok, model_dir, prompt, grammar, args.runs, jump))
    print(f"{args.runs} constrained first turns, prompt {args.prompt_tokens} tokens, {args.reps} reps (median)")
    med = {j: [statistics.median(r[k] for r in results[j]) for k in range(4)] for j in results}
    for jump, name in ((False, "token by token"), (True, "jump-forward")):
        wall, cpu, steps, tokens = med[jump]
        print(f"  {name:15s} wall {wall:6.2f} s  cpu {cpu:6.2f} s  decode steps {steps:5.0f}  output tokens {tokens:5.0f}")
    print(f"  ratio jump-forward / token by token: wall {med[True][0] / med[False][0]:.2f}, "
          f"cpu {med[True][1] / med[False][1]:.2f}")


if __name__ == "__main__":
    main()
