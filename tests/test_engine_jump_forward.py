"""Jump-forward over grammar-forced tokens: the scheduler appends a token the grammar alone decides without a
decode step, and runs the appended tokens in one forward when the model must choose again.

In-process schedulers over the session's tiny model, the same requests with jump-forward on and off: greedy
outputs, log-probs, top and requested-id log-probs must be identical, with far fewer decode steps.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from slimecli.engine.grammar import GrammarCache, forced_token
from slimecli.engine.protocol import Constraint, parse_generate
from slimecli.engine.scheduler import Scheduler
from slimecli.engine.seq import Seq, build_reply
from slimecli.model.loading import load_model, load_tokenizer

SCHEMA = json.dumps({"type": "object", "properties": {
    "name": {"type": "string", "enum": ["alpha", "beta"]}, "count": {"type": "integer", "minimum": 0}},
    "required": ["name", "count"], "additionalProperties": False})
HEAD = "# Two edits are listed for the problem reported in the parser module; choose one of them:\\n"
EDITS = ("sed -i s/old_value/new_value/ src/parser/file.py", "echo note >> src/parser/file.py")
CHOICES = f'start: "{HEAD}" ("{EDITS[0]}" | "{EDITS[1]}")\n'  # a long forced run, a choice, another run
TEXTS = tuple(HEAD.replace("\\n", "\n") + e for e in EDITS)


def _run(model_dir: Path, bodies: list[dict[str, Any]], jump: bool) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Replies of one batch of requests run together, and the scheduler's counters."""
    tok = load_tokenizer(model_dir)
    model = load_model(model_dir, "float32", "cpu")
    vocab = int(model.config.vocab_size)
    eos = frozenset({int(tok.eos_token_id)})
    grammars = GrammarCache(lambda: load_tokenizer(model_dir), vocab, eos)
    seqs: list[Seq] = []
    for i, body in enumerate(bodies):
        item = parse_generate(body, vocab).items[0]
        item.rid = f"r{i}"
        c = item.params.constraint
        seqs.append(Seq(item=item, prompt_ids=list(item.prompt_ids or []), eos_ids=eos,
                        grammar=grammars.compile(c).matcher() if c is not None else None))
    finished = threading.Event()

    def dispatch(updates: list[Any]) -> None:
        if all(s.done for s in seqs):
            finished.set()

    sched = Scheduler(model, tok, pad_id=int(tok.eos_token_id), seed=0, jump_forward=jump, dispatch=dispatch)
    sched.start()
    try:
        sched.submit(seqs)
        assert finished.wait(120), "the requests did not finish"
    finally:
        sched.stop()
    return [build_reply(s, tok, "v") for s in seqs], dict(sched.stats)


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    """The same reply up to float rounding: rows batched differently see other padding in their matmuls."""
    assert (a["text"], a["output_ids"]) == (b["text"], b["output_ids"])
    for key in sorted(set(a["meta_info"]) | set(b["meta_info"])):
        x, y = a["meta_info"].get(key), b["meta_info"].get(key)
        if key == "e2e_latency":
            continue
        if key.endswith("logprobs"):  # [[logprob, id, text], ...] or, for top/ids, a list of those per position
            flat = (lambda v: [e for pos in v for e in (pos or [])]) if "top" in key or "ids" in key else list
            fx, fy = flat(x), flat(y)
            assert [e[1:] for e in fx] == [e[1:] for e in fy], key
            assert [e[0] for e in fx] == pytest.approx([e[0] for e in fy], abs=1e-4), key
        else:
            assert x == y, key


def test_forced_token_is_the_only_one_the_mask_allows(tiny: Path) -> None:
    tok = load_tokenizer(tiny)
    cache = GrammarCache(lambda: load_tokenizer(tiny), 4096, {int(tok.eos_token_id)})
    m = cache.compile(Constraint("ebnf", CHOICES)).matcher()
    assert forced_token(m) is not None  # "# " begins both choices
    ids = tok.encode(TEXTS[0], add_special_tokens=False)
    forced = 0
    for t in ids:
        f = forced_token(m)
        assert f is None or f == t
        forced += f is not None
        assert m.consume(t)
    assert forced >= len(ids) - 3  # the texts part once: every other token is forced
    assert forced_token(m) == int(tok.eos_token_id)  # one end-of-text id: the end is forced too
    m2 = cache.compile(Constraint("regex", "[a-z]{3}")).matcher()
    assert forced_token(m2) is None  # many letters allowed


def test_greedy_outputs_and_log_probs_are_the_same_with_far_fewer_decode_steps(tiny: Path) -> None:
    prompt = [11, 22, 33, 44, 55]
    bodies = [
        {"input_ids": prompt, "return_logprob": True, "top_logprobs_num": 3, "token_ids_logprob": [5, 9],
         "sampling_params": {"ebnf": CHOICES, "temperature": 0, "max_new_tokens": 64}},
        {"input_ids": prompt[:3], "return_logprob": True,
         "sampling_params": {"json_schema": SCHEMA, "temperature": 0, "max_new_tokens": 48}},
        {"input_ids": prompt + [66, 77], "return_logprob": True,  # unconstrained, in the same batch
         "sampling_params": {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}},
        {"input_ids": prompt, "return_logprob": True,  # the length limit falls inside a forced run
         "sampling_params": {"ebnf": CHOICES, "temperature": 0, "max_new_tokens": 7}},
    ]
    plain, plain_stats = _run(tiny, bodies, jump=False)
    jumped, stats = _run(tiny, bodies, jump=True)
    for a, b in zip(jumped, plain, strict=True):
        _same(a, b)
    assert plain_stats["forced_tokens"] == 0 and stats["forced_tokens"] > 20
    assert stats["extends"] >= 1
    assert stats["steps"] < plain_stats["steps"]
    (alone,), alone_stats = _run(tiny, bodies[:1], jump=True)
    _same(alone, plain[0])
    assert alone_stats["steps"] <= 4 < 25 <= len(alone["output_ids"])  # decode steps only where the texts part
    first = jumped[0]
    assert first["meta_info"]["finish_reason"]["type"] == "stop"
    assert first["text"] in TEXTS
    assert jumped[3]["meta_info"]["finish_reason"] == {"type": "length", "length": 7}
    assert jumped[1]["text"].startswith('{"name": "')  # keys and punctuation were forced


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sampled_outputs_stay_in_the_grammar_with_masked_log_probs(tiny: Path, seed: int) -> None:
    body = {"input_ids": [7, 8, 9], "return_logprob": True,
            "sampling_params": {"ebnf": CHOICES, "temperature": 1.0, "max_new_tokens": 64, "sampling_seed": seed}}
    replies, _ = _run(tiny, [body, dict(body, input_ids=[7, 8])], jump=True)
    for reply in replies:
        assert reply["text"] in TEXTS
        lps = [e[0] for e in reply["meta_info"]["output_token_logprobs"]]
        assert all(lp <= 0 for lp in lps) and sum(lp < 0 for lp in lps) <= 2  # only where the texts part
