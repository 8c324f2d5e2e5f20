"""In-process checks of the engine's parts: the sampler's filters and log-probs, and the batch KV cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from slimecli.engine.protocol import Item, SamplingParams
from slimecli.engine.runner import PREFILL_SPLIT_PAD, Runner
from slimecli.engine.sampling import RowState, make_generator, sample
from slimecli.engine.seq import Seq
from slimecli.model.tiny import create_tiny_model


def row(seed: int | None = None, **kw: object) -> RowState:
    p = SamplingParams(**kw)
    return RowState(p, make_generator(seed), [], [], [])


def test_logprob_is_full_vocab_at_temperature() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    rows = [row(temperature=0.5, top_k=3), row(temperature=2.0, top_p=0.3), row(temperature=0.0)]
    draw = sample(logits, rows, torch.Generator().manual_seed(1))
    for i, (t, temp) in enumerate(zip(draw.tokens, [0.5, 2.0, 1.0], strict=True)):
        assert draw.logprobs[i] == pytest.approx(torch.log_softmax(logits[i] / temp, -1)[t].item(), abs=1e-6)
    assert draw.tokens[2] == int(logits[2].argmax())


def test_filters_restrict_the_draw() -> None:
    logits = torch.tensor([[5.0, 4.0, 3.0, 0.0, -1.0, -2.0]])
    gen = torch.Generator().manual_seed(0)
    seen_k, seen_p, seen_min = set(), set(), set()
    for _ in range(300):
        seen_k.add(sample(logits, [row(temperature=3.0, top_k=2)], gen).tokens[0])
        # probs at T=1: .66 .24 .09 ...: top_p 0.8 keeps the first two tokens
        seen_p.add(sample(logits, [row(top_p=0.8)], gen).tokens[0])
        seen_min.add(sample(logits, [row(temperature=2.0, min_p=0.5)], gen).tokens[0])
    assert seen_k == {0, 1} and seen_p == {0, 1} and seen_min <= {0, 1, 2} and 0 in seen_min


def test_a_seeded_row_draws_its_generators_stream_in_order() -> None:
    """The numbers drawn ahead in blocks are the generator's stream one call at a time (across block ends), and a
    seeded row's tokens over many steps are those of the stream's inverse-CDF draws."""
    from slimecli.engine.sampling import UNIFORM_AHEAD

    r, ref = row(seed=11), make_generator(11)
    assert ref is not None
    drawn = [r.uniform() for _ in range(2 * UNIFORM_AHEAD + 5)]
    assert drawn == [torch.rand(1, generator=ref, dtype=torch.float64).item() for _ in drawn]

    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    seeded, ref = row(seed=5), make_generator(5)
    assert ref is not None
    for _ in range(3 * UNIFORM_AHEAD):
        u = torch.rand(1, generator=ref, dtype=torch.float64).item()
        want = int(torch.searchsorted(probs[0].double().cumsum(0), torch.tensor([u], dtype=torch.float64),
                                      right=True).clamp(max=3))
        assert sample(probs.log().expand(3, -1), [row(), seeded, row()]).tokens[1] == want


def test_seeded_rows_do_not_depend_on_the_batch() -> None:
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(3))
    alone = [sample(logits[1:2], [row(seed=7)]).tokens[0] for _ in range(1)]
    together = sample(logits, [row(), row(seed=7), row(), row(seed=9)]).tokens[1]
    assert together == alone[0]
    blocked = RowState(SamplingParams(temperature=0.0), None, [], [], [int(logits[0].argmax())])
    assert sample(logits[:1], [blocked]).tokens[0] != int(logits[0].argmax())


def test_penalties_change_only_the_draw() -> None:
    logits = torch.tensor([[2.0, 1.9, 0.0]])
    r = RowState(SamplingParams(temperature=0.0, frequency_penalty=1.0), None, [0, 0], [], [])
    d = sample(logits, [r])
    assert d.tokens == [1]
    assert d.logprobs[0] == pytest.approx(torch.log_softmax(logits[0], -1)[1].item())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=2)


def other_arch(name: str) -> torch.nn.Module:
    """Small random models of other architectures: the engine must not assume Qwen3."""
    from transformers import AutoConfig

    common = {"vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512}
    extra = {"llama": {}, "qwen2": {}, "mistral": {"sliding_window": 3}}[name]
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(name, **common, **extra)
    cfg._attn_implementation = "sdpa"
    return AutoModelForCausalLM.from_config(cfg).eval()


@pytest.mark.parametrize("arch", ["qwen3-tiny", "llama", "qwen2", "mistral"])
def test_runner_joins_rows_mid_batch_and_matches_full_forward(tiny: Path, arch: str) -> None:
    if arch == "qwen3-tiny":
        model = AutoModelForCausalLM.from_pretrained(str(tiny), attn_implementation="sdpa").eval()
    else:
        model = other_arch(arch)
    runner = Runner(model, pad_id=0)

    def seq(prompt: list[int]) -> Seq:
        item = Item(index=0, rid="r", prompt_ids=prompt, text=None, params=SamplingParams(temperature=0.0))
        return Seq(item=item, prompt_ids=prompt, eos_ids=frozenset())

    a, b, c = seq([5, 6, 7, 8, 9, 10]), seq([11, 12]), seq([13, 14, 15])
    forced = {id(a): [20, 21, 22, 23, 24], id(b): [30, 31, 32, 33], id(c): [40, 41]}  # teacher-forced tokens
    got: dict[int, list[torch.Tensor]] = {id(a): [], id(b): [], id(c): []}

    def push(rows: list[Seq], logits: torch.Tensor) -> None:
        for s, lg in zip(rows, logits, strict=True):
            got[id(s)].append(lg)
            s.output_ids.append(forced[id(s)][len(s.output_ids)])

    push([a], runner.prefill([a]))
    push(runner.rows, runner.decode())
    push([b, c], runner.prefill([b, c]))  # joins a batch that is two tokens ahead, different lengths
    push(runner.rows, runner.decode())
    runner.remove([True, True, False])  # c leaves
    push(runner.rows, runner.decode())
    assert [len(got[id(s)]) for s in (a, b, c)] == [4, 3, 2]
    with torch.no_grad():
        for s in (a, b, c):
            full = model(torch.tensor([s.prompt_ids + s.output_ids])).logits[0]
            n = len(s.prompt_ids)
            for k, lg in enumerate(got[id(s)]):
                assert torch.allclose(lg, full[n - 1 + k], atol=1e-4), (s.prompt_ids, k)


def test_prefill_groups_split_where_padding_would_cost_more_than_a_forward(tiny: Path) -> None:
    def seq(n: int) -> Seq:
        prompt = list(range(1, n + 1))
        item = Item(index=0, rid="r", prompt_ids=prompt, text=None, params=SamplingParams(temperature=0.0))
        return Seq(item=item, prompt_ids=prompt, eos_ids=frozenset())

    model = AutoModelForCausalLM.from_pretrained(str(tiny)).eval()
    runner = Runner(model, pad_id=0, max_prefill_tokens=1000)
    lengths = [80, 60, 61, 62, 20, 21, 63, 22]
    groups = runner.groups([seq(n) for n in lengths])
    # three groups of like length: each member padded by at most 3 tokens (the 20s and 60s would have cost 8 x 40)
    assert [[len(s.prompt_ids) for s in g] for g in groups] == [[20, 21, 22], [60, 61, 62, 63], [80]]
    assert all((n - len(g[0].prompt_ids)) * (len(g) - 1) <= PREFILL_SPLIT_PAD
               for g in groups for n in [len(g[-1].prompt_ids)])
    small = Runner(model, pad_id=0, max_prefill_tokens=130)  # the padded size bound still holds
    assert [len(g) for g in small.groups([seq(n) for n in lengths])] == [3, 2, 2, 1]


def test_prefix_cache_reuses_a_shared_prefix(tiny: Path) -> None:
    from slimecli.engine.prefix_cache import PrefixCache, common_prefix

    assert common_prefix([1, 2, 3, 4], [1, 2, 9]) == 2 and common_prefix([1, 2], [1, 2, 3]) == 2
    model = AutoModelForCausalLM.from_pretrained(str(tiny), attn_implementation="sdpa").eval()
    prefix = PrefixCache(max_bytes=1 << 26, min_tokens=4)
    runner = Runner(model, pad_id=0, prefix_cache=prefix)

    def seq(prompt: list[int]) -> Seq:
        item = Item(index=0, rid="r", prompt_ids=prompt, text=None, params=SamplingParams(temperature=0.0))
        return Seq(item=item, prompt_ids=prompt, eos_ids=frozenset())

    first = seq(list(range(10, 30)))
    runner.prefill([first])  # its prompt is offered at once: a session starting now shares it
    assert [e.tokens for e in prefix.entries.values()] == [list(range(10, 30))]
    first.output_ids.append(7)
    runner.decode()
    first.output_ids.append(8)
    runner.remove([False])  # finished: its 21 cached tokens (prompt + first output) supersede the prompt
    assert [e.tokens for e in prefix.entries.values()] == [list(range(10, 30)) + [7]]
    # the next turn extends the conversation; another prompt shares only the first 12 tokens
    turn2, other = seq(list(range(10, 30)) + [7, 8, 99, 98]), seq(list(range(10, 22)) + [5, 5, 5])
    logits = runner.prefill([turn2, other])
    assert (turn2.cached_tokens, other.cached_tokens) == (21, 12)
    with torch.no_grad():
        for s, lg in zip((turn2, other), logits, strict=True):
            full = model(torch.tensor([s.prompt_ids])).logits[0, -1]
            assert torch.allclose(lg, full, atol=1e-4)
    turn2.output_ids.append(3)
    other.output_ids.append(4)
    step = runner.decode()  # both keep decoding in one batch on top of the reused keys/values
    with torch.no_grad():
        for s, lg in zip((turn2, other), step, strict=True):
            assert torch.allclose(lg, model(torch.tensor([s.context()])).logits[0, -1], atol=1e-4)
    late = seq(list(range(10, 22)) + [5, 5, 6, 6])  # starts while `other` still runs: shares 14 tokens
    lg = runner.prefill([late])[0]
    assert late.cached_tokens == 14
    with torch.no_grad():
        assert torch.allclose(lg, model(torch.tensor([late.prompt_ids])).logits[0, -1], atol=1e-4)
    runner.set_model(model)  # new weights: nothing cached may survive
    assert not prefix.entries
    late.output_ids.append(2)  # a row kept through the update (paused in place) holds the old keys/values:
    runner.remove([True, True, False])  # when it leaves, they must not serve the new weights either
    assert not prefix.entries


def test_draws_follow_the_distribution() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, float("-inf")]]).repeat(20000, 1)
    rows = [row(temperature=0.8)] * 20000
    draw = sample(logits, rows, torch.Generator().manual_seed(0))
    freq = torch.bincount(torch.tensor(draw.tokens), minlength=5).float() / 20000
    expected = torch.softmax(logits[0] / 0.8, -1)
    assert torch.allclose(freq, expected, atol=0.012), (freq, expected)
    assert freq[4] == 0


def test_draws_across_blocks_of_a_large_vocabulary() -> None:
    """The two-level draw: mass spread over several blocks, one in the last short block; zero-weight tokens
    (between them, and ending blocks) are never drawn, and each drawn token reports its own log-prob."""
    vocab = 64 * 5 + 7
    mass = {3: 0.1, 63: 0.2, 64: 0.05, 200: 0.3, vocab - 6: 0.15, vocab - 1: 0.2}
    logits = torch.full((vocab,), float("-inf"))
    for token, p in mass.items():
        logits[token] = torch.tensor(p).log()
    n = 40000
    draw = sample(logits.repeat(n, 1), [row()] * n, torch.Generator().manual_seed(1))
    freq = torch.bincount(torch.tensor(draw.tokens), minlength=vocab).float() / n
    assert set(torch.nonzero(freq).flatten().tolist()) == set(mass)
    for token, p in mass.items():
        assert freq[token].item() == pytest.approx(p, abs=0.01), token
        assert draw.logprobs[draw.tokens.index(token)] == pytest.approx(torch.tensor(p).log().item(), abs=1e-5)


class WrappedLinear(torch.nn.Linear):
    """Not transformers' own part (as a LoRA or quantised linear would not be): its layer runs its own forward."""


@pytest.mark.parametrize("arch", ["qwen3-tiny", "qwen3-wrapped", "llama", "qwen2", "mistral"])
def test_decode_steps_give_the_full_forwards_logits_bit_for_bit(tiny: Path, arch: str) -> None:
    """The decoder (the model's modules without its outer forward) against the model's own forward, on a padded
    batch whose rows joined at different lengths, step after step."""
    from slimecli.engine.decoder import Decoder

    own = 0  # layers that run their own forward
    if arch.startswith("qwen3"):
        model = AutoModelForCausalLM.from_pretrained(str(tiny), attn_implementation="sdpa").eval()
        if arch == "qwen3-wrapped":
            mlp = model.model.layers[0].mlp
            wrapped = WrappedLinear(mlp.up_proj.in_features, mlp.up_proj.out_features, bias=False)
            wrapped.weight = mlp.up_proj.weight
            mlp.up_proj, own = wrapped, 1
    else:
        model = other_arch(arch)
        if arch == "mistral":
            assert Decoder.of(model) is None  # a sliding window: the full forward's mask, not this one
            model.config.sliding_window = None
    decoder = Decoder.of(model)
    assert decoder is not None and decoder.reproduced == len(model.model.layers) - own  # op for op
    fast, full = Runner(model, pad_id=0), Runner(model, pad_id=0)
    full.decoder = None

    def seqs() -> list[Seq]:
        return [Seq(item=Item(index=0, rid="r", prompt_ids=p, text=None, params=SamplingParams(temperature=0.0)),
                    prompt_ids=p, eos_ids=frozenset()) for p in ([5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16])]

    for runner in (fast, full):
        rows = seqs()
        runner.prefill(rows[:1])
        rows[0].output_ids.append(20)
        runner.decode()
        rows[0].output_ids.append(21)
        runner.prefill(rows[1:])
        for r in rows[1:]:
            r.output_ids.append(30)
    for step in range(4):
        a, b = fast.decode(), full.decode()
        assert torch.equal(a, b), step
        for r1, r2, tok in zip(fast.rows, full.rows, a.argmax(-1).tolist(), strict=True):
            r1.output_ids.append(tok)
            r2.output_ids.append(tok)
        if step == 1:  # a row leaves: the padding columns shift
            fast.remove([True, False, True])
            full.remove([True, False, True])
    lone = Runner(model, pad_id=0)  # no padding at all: no mask
    row = seqs()[0]
    lone.prefill([row])
    row.output_ids.append(3)
    with torch.inference_mode():
        want = model(torch.tensor([row.context()])).logits[0, -1]
    assert torch.allclose(lone.decode()[0], want, atol=1e-5)
