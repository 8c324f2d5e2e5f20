"""Grammar libraries for structured outputs, side by side on the engine's own tokenizer.

For each library that imports here (llguidance, xgrammar, outlines-core) and the tiny model's 4096-token
byte-level BPE: the one-time tokenizer set-up, the compile time of a regex, a JSON schema and an EBNF
grammar (no caches), the cost of a fresh matcher for an already compiled grammar (what a cached request
pays), and the per-token time of computing the next-token bitmask plus advancing the matcher, over
seeded random walks through each grammar. Prints each figure and its ratio to the engine's library.
outlines-core has no EBNF front end: that row reads n/a.

    python bench/bench_grammar.py [--walks 20 --tokens 48]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ENGINE_LIBRARY = "llguidance"
REGEX = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01]) [a-z]{3,8}( [A-Z][a-z]{2,6}){0,2}"
SCHEMA = json.dumps({
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "kind": {"type": "string", "enum": ["alpha", "beta", "gamma"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        "point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                  "required": ["x", "y"], "additionalProperties": False},
    },
    "required": ["id", "kind"],
    "additionalProperties": False,
})
EBNF = r'''root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= number | "(" expr ")"
number ::= [0-9]+
'''
GRAMMARS = {"regex": REGEX, "json_schema": SCHEMA, "ebnf": EBNF}


class Library:
    """One grammar library behind the four operations the engine needs."""

    name = ""

    def setup(self, tokenizer: Any, vocab: int, eos: int) -> None:
        raise NotImplementedError

    def compile(self, kind: str, text: str) -> Any:
        raise NotImplementedError

    def matcher(self, compiled: Any) -> Any:
        raise NotImplementedError

    def fill(self, m: Any, bitmask: Any) -> None:
        raise NotImplementedError

    def advance(self, m: Any, token: int) -> bool:
        raise NotImplementedError


class LLGuidance(Library):
    name = "llguidance"

    def setup(self, tokenizer: Any, vocab: int, eos: int) -> None:
        import llguidance
        import llguidance.hf

        self.ll = llguidance
        self.tok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=eos)

    def compile(self, kind: str, text: str) -> Any:
        LLMatcher = self.ll.LLMatcher
        grammar = {"regex": LLMatcher.grammar_from_regex, "json_schema": LLMatcher.grammar_from_json_schema,
                   "ebnf": lambda t: self.ll.grammar_from("ebnf", t)}[kind](text)
        m = LLMatcher(self.tok, grammar, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def matcher(self, compiled: Any) -> Any:
        return compiled.deep_copy()

    def fill(self, m: Any, bitmask: Any) -> None:
        m.unsafe_compute_mask_ptr(bitmask.data_ptr(), bitmask.numel() * 4)

    def advance(self, m: Any, token: int) -> bool:
        return m.consume_token(token) and not m.is_stopped()


class XGrammar(Library):
    name = "xgrammar"

    def setup(self, tokenizer: Any, vocab: int, eos: int) -> None:
        import xgrammar

        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab, stop_token_ids=[eos])
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, kind: str, text: str) -> Any:
        c = self.compiler
        return {"regex": c.compile_regex, "json_schema": c.compile_json_schema, "ebnf": c.compile_grammar}[kind](text)

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m: Any, bitmask: Any) -> None:
        m.fill_next_token_bitmask(bitmask.unsqueeze(0), 0)

    def advance(self, m: Any, token: int) -> bool:
        return m.accept_token(token) and not m.is_terminated()


class OutlinesCore(Library):
    name = "outlines-core"

    def setup(self, tokenizer: Any, vocab: int, eos: int) -> None:
        import outlines_core

        self.oc = outlines_core
        byte_of = {c: b for b, c in _bytes_to_unicode().items()}
        special = set(tokenizer.all_special_ids) | {eos}
        tokens: dict[bytes, list[int]] = {}
        for piece, tid in tokenizer.get_vocab().items():
            if tid in special or tid >= vocab or any(ch not in byte_of for ch in piece):
                continue  # added / special tokens: never produced inside a grammar
            tokens.setdefault(bytes(byte_of[ch] for ch in piece), []).append(tid)
        self.vocab = outlines_core.Vocabulary(eos, tokens)

    def compile(self, kind: str, text: str) -> Any:
        if kind == "ebnf":
            raise NotImplementedError("no EBNF support")
        regex = self.oc.json_schema.build_regex_from_schema(text) if kind == "json_schema" else text
        return self.oc.Index(regex, self.vocab)

    def matcher(self, compiled: Any) -> Any:
        return self.oc.Guide(compiled)

    def fill(self, m: Any, bitmask: Any) -> None:
        m.write_mask_into(bitmask.data_ptr(), bitmask.numel(), 4)

    def advance(self, m: Any, token: int) -> bool:
        m.advance(token, return_tokens=False)
        return not m.is_finished()


def _bytes_to_unicode() -> dict[int, str]:
    """The byte -> printable character table of byte-level BPE (GPT-2's)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def timed(fn: Callable[[], Any], repeat: int = 1) -> tuple[float, Any]:
    """Median seconds of `repeat` calls, and the last result."""
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def walk(lib: Library, compiled: Any, vocab: int, eos: int, seed: int, max_tokens: int) -> tuple[float, int, str]:
    """Sample uniformly among allowed tokens; returns (seconds spent masking + advancing, tokens, allowed ids)."""
    import torch

    rng = random.Random(seed)
    m = lib.matcher(compiled)
    bitmask = torch.zeros((vocab + 31) // 32, dtype=torch.int32)
    bits = torch.arange(32, dtype=torch.int32)
    spent, steps, trace = 0.0, 0, []
    for _ in range(max_tokens):
        t0 = time.perf_counter()
        lib.fill(m, bitmask)
        spent += time.perf_counter() - t0
        allowed = ((bitmask.unsqueeze(1) >> bits) & 1).flatten()[:vocab].nonzero().flatten().tolist()
        choices = [t for t in allowed if t != eos] or allowed
        if not choices:
            break
        tok = rng.choice(choices)
        trace.append(tok)
        t0 = time.perf_counter()
        going = lib.advance(m, tok)
        spent += time.perf_counter() - t0
        steps += 1
        if not going:
            break
    return spent, steps, ",".join(map(str, trace))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--walks", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeat", type=int, default=5, help="compile repetitions (median)")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from slimecli.model.tokenizer import DEFAULT_VOCAB_SIZE, IM_END, build_tokenizer, save_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        save_tokenizer(build_tokenizer(DEFAULT_VOCAB_SIZE), tmp)
        tokenizer = AutoTokenizer.from_pretrained(tmp)
    vocab = -(-len(tokenizer) // 64) * 64  # the tiny model's embedding rows
    eos = tokenizer.convert_tokens_to_ids(IM_END)
    print(f"tokenizer: {len(tokenizer)} tokens (byte-level BPE), logits width {vocab}; "
          f"{args.walks} random walks of <= {args.tokens} tokens per grammar\n")

    results: dict[str, dict[str, float | None]] = {}
    for lib in (LLGuidance(), XGrammar(), OutlinesCore()):
        try:
            setup_s, _ = timed(lambda lib=lib: lib.setup(tokenizer, vocab, eos))
        except ImportError as exc:
            print(f"{lib.name}: not installed ({exc.name}); skipped")
            continue
        row: dict[str, float | None] = {"tokenizer set-up ms": setup_s * 1e3}
        for kind, text in GRAMMARS.items():
            try:
                compile_s, compiled = timed(lambda lib=lib, k=kind, t=text: lib.compile(k, t), args.repeat)
            except NotImplementedError:
                for what in ("compile ms", "matcher us", "mask+advance us/token"):
                    row[f"{kind} {what}"] = None
                continue
            matcher_s, _ = timed(lambda lib=lib, c=compiled: lib.matcher(c), 50)
            spent = steps = 0
            for seed in range(args.walks):
                s, n, _ = walk(lib, compiled, vocab, eos, seed, args.tokens)
                spent, steps = spent + s, steps + n
            row[f"{kind} compile ms"] = compile_s * 1e3
            row[f"{kind} matcher us"] = matcher_s * 1e6
            row[f"{kind} mask+advance us/token"] = spent / max(steps, 1) * 1e6
        results[lib.name] = row

    if not results:
        raise SystemExit("no grammar library is installed")
    names = list(results)
    base = ENGINE_LIBRARY if ENGINE_LIBRARY in results else names[0]
    metrics = list(results[names[0]])
    width = max(len(m) for m in metrics) + 2
    print(f"{'':{width}}" + "".join(f"{n:>16}" for n in names) + "".join(f"{n + '/' + base:>26}" for n in names
                                                                            if n != base))
    for metric in metrics:
        vals = [results[n].get(metric) for n in names]
        line = f"{metric:<{width}}" + "".join(f"{'n/a' if v is None else f'{v:.1f}':>16}" for v in vals)
        b = results[base].get(metric)
        for n, v in zip(names, vals, strict=True):
            if n != base:
                line += f"{'n/a' if v is None or not b else f'{v / b:.2f}x':>26}"
        print(line)
    print(f"\nratios > 1: slower than {base}, the engine's grammar library. Beyond speed: llguidance depends on"
          " nothing else; xgrammar (SGLang's default) pulls in triton, pydantic and apache-tvm-ffi; outlines-core"
          " has no EBNF front end and compiles JSON schemas via one large regex.")


if __name__ == "__main__":
    main()
