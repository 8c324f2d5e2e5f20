"""env=reasoning_gym: a procedural dataset by name and config, its entries as tasks, answers scored by the dataset's
own score_answer (right, wrong, partial), a train/eval split that does not overlap, and the errors users see."""

from __future__ import annotations

import asyncio
import difflib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import reasoning_gym
from reasoning_gym.utils import SYSTEM_PROMPTS

from slimecli.config.groups.env import EnvConfig
from slimecli.env.adapters import reasoning_gym as adapter
from slimecli.env.protocol import StepResult
from slimecli.env.provider import EnvLoadError, EnvNotFound, EnvProvider
from tests.helpers.episodes import play

CFG = EnvConfig(name="reasoning_gym")
CHAIN = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2, "size": 30, "seed": 7}


def answer(provider: EnvProvider, row: dict[str, Any], content: str) -> tuple[list[dict[str, Any]], StepResult]:
    obs, [result] = asyncio.run(play(provider, row, [content]))
    return obs.messages, result


def test_dataset_by_name_with_config() -> None:
    provider = adapter.load("chain_sum", CHAIN, CFG)
    rows = provider.tasks("train")
    own = reasoning_gym.create_dataset("chain_sum", **CHAIN)
    assert len(rows) == 30
    assert [(r["question"], r["answer"], r["index"]) for r in rows] == [
        (own[i]["question"], own[i]["answer"], i) for i in range(30)]
    assert rows[0]["metadata"] == own[0]["metadata"]
    assert adapter.load("chain_sum", CHAIN, CFG).tasks("train") == rows  # reproducible
    assert "seed 7" in provider.describe()

    messages, _ = answer(provider, rows[0], "")
    assert messages == [{"role": "system", "content": SYSTEM_PROMPTS["direct"]},
                        {"role": "user", "content": rows[0]["question"]}]


def test_right_wrong_and_partial_answers_use_the_datasets_own_score() -> None:
    provider = adapter.load("chain_sum", CHAIN, CFG)
    own = reasoning_gym.create_dataset("chain_sum", **CHAIN)
    row = provider.tasks("train")[3]
    truth = row["answer"]
    wrong = str(int(truth) + 1)

    _, right = answer(provider, row, f"Adding them up.\n<answer>{truth}</answer>")
    assert (right.reward, right.done) == (1.0, True) and right.info == {"answer": truth, "expected": truth}
    _, bad = answer(provider, row, f"<answer>{wrong}</answer>")
    assert (bad.reward, bad.done) == (0.0, True)
    _, partial = answer(provider, row, f"<answer>{truth} total</answer>")
    assert 0.0 < partial.reward < 1.0
    assert partial.reward == own.score_answer(f"{truth} total", own[3])
    _, untagged = answer(provider, row, truth)  # the answer must be in the tags
    assert untagged.reward == 0.0 and untagged.info["answer"] is None
    _, last = answer(provider, row, f"<answer>{wrong}</answer> no wait <answer>{truth}</answer>")
    assert last.reward == 1.0  # the last tagged answer counts, as reasoning-gym's extract_answer reads it


def test_a_dataset_with_its_own_scorer() -> None:
    args = {"min_word_len": 4, "max_word_len": 4, "size": 5, "seed": 1}
    provider = adapter.load("spell_backward", args, CFG)
    own = reasoning_gym.create_dataset("spell_backward", **args)
    row = provider.tasks()[0]
    guess = row["answer"][:-1] + ("x" if row["answer"][-1] != "x" else "y")
    _, result = answer(provider, row, f"<answer>{guess}</answer>")
    assert result.reward == own.score_answer(guess, own[0])
    assert 0.0 < result.reward < 1.0  # spell_backward gives credit by similarity


def test_untagged_answers_and_system_prompts() -> None:
    provider = adapter.load("count_bits", {"min_n": 1, "max_n": 7, "size": 7, "answer_tag": None}, CFG)
    row = provider.tasks()[0]
    messages, result = answer(provider, row, f" {row['answer']}\n")
    assert messages == [{"role": "user", "content": row["question"]}]  # no tags asked for, no system prompt
    assert result.reward == 1.0
    _, result = answer(provider, row, f"{row['answer']}ab")
    assert result.reward == pytest.approx(1 / 3)  # the base scorer's partial credit: len(answer) / len(reply)

    named = adapter.load("count_bits", {"system_prompt": "DeepSeekZero"}, CFG)
    assert answer(named, row, "")[0][0] == {"role": "system", "content": SYSTEM_PROMPTS["DeepSeekZero"]}
    text = adapter.load("count_bits", {"system_prompt": "Reply with <answer>N</answer>."}, CFG)
    assert answer(text, row, "")[0][0]["content"] == "Reply with <answer>N</answer>."
    assert answer(adapter.load("count_bits", {"system_prompt": None}, CFG), row, "")[0][0]["role"] == "user"


def test_eval_split_is_disjoint_from_train() -> None:
    provider = adapter.load("chain_sum", {**CHAIN, "size": 100}, CFG)
    train, evals = provider.tasks("train"), provider.tasks("eval")
    assert len(evals) == 100 and [r["index"] for r in evals] == list(range(100))
    assert not {r["question"] for r in train} & {r["question"] for r in evals}
    assert provider.tasks("eval") == adapter.load("chain_sum", {**CHAIN, "size": 100}, CFG).tasks("eval")
    _, result = answer(provider, evals[0], f"<answer>{evals[0]['answer']}</answer>")
    assert result.reward == 1.0

    sized = adapter.load("chain_sum", {**CHAIN, "eval_size": 10, "eval_seed": 12345}, CFG)
    assert len(sized.tasks("eval")) == 10
    # a small problem space: eval keeps only questions train does not have
    small = adapter.load("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                                              "operators": ["+"], "allow_parentheses": False,
                                              "allow_negation": False, "size": 150}, CFG)
    train_q = {r["question"] for r in small.tasks("train")}
    assert 0 < len(small.tasks("eval")) < 150 and not train_q & {r["question"] for r in small.tasks("eval")}
    tiny = adapter.load("count_bits", {"min_n": 1, "max_n": 7, "size": 50}, CFG)
    with pytest.raises(ValueError, match="eval split is empty"):
        tiny.tasks("eval")
    with pytest.raises(ValueError, match="no split 'test'; the splits are train, eval"):
        provider.tasks("test")


def test_composite() -> None:
    args: dict[str, Any] = {"size": 20, "seed": 3, "datasets": [
        {"name": "chain_sum", "weight": 1, "config": {"max_terms": 2, "max_digits": 1}},
        {"name": "count_bits", "weight": 1, "config": {"max_n": 15}}]}
    provider = adapter.load("composite", args, CFG)
    rows = provider.tasks()
    assert {r["metadata"]["source_dataset"] for r in rows} == {"chain_sum", "count_bits"}
    for row in rows[:4]:
        assert answer(provider, row, f"<answer>{row['answer']}</answer>")[1].reward == 1.0
    assert not {r["question"] for r in rows} & {r["question"] for r in provider.tasks("eval")}
    with pytest.raises(EnvLoadError, match=r"datasets\[1\].name: no dataset 'count_bit' \(did you mean 'count_bits'"):
        adapter.load("composite", {"datasets": [args["datasets"][0], {"name": "count_bit", "weight": 1}]}, CFG)
    with pytest.raises(EnvLoadError, match=r"'count_bits' has no config key 'max_m' \(env.args.datasets\[0\].config"):
        adapter.load("composite", {"datasets": [{"name": "count_bits", "config": {"max_m": 3}}]}, CFG)


def test_unknown_name_offers_a_close_match() -> None:
    with pytest.raises(EnvNotFound) as err:
        adapter.load("chain_sun", {}, CFG)
    assert "chain_sum" in err.value.known and "composite" in err.value.known
    assert difflib.get_close_matches("chain_sun", err.value.known, n=1) == ["chain_sum"]
    assert "did you mean 'chain_sum'" in str(err.value)


def test_bad_config_names_the_key() -> None:
    with pytest.raises(EnvLoadError, match=r"no config key 'max_digitz' \(env.args.max_digitz\) \(did you mean "
                                           r"'max_digits'\?\).*min_terms"):
        adapter.load("chain_sum", {"max_digitz": 2}, CFG)
    with pytest.raises(EnvLoadError, match="'chain_sum' rejected its config.*max_terms"):
        adapter.load("chain_sum", {"min_terms": 5, "max_terms": 2}, CFG)
    with pytest.raises(EnvLoadError, match="answer_tag must be a tag name"):
        adapter.load("chain_sum", {"answer_tag": 3}, CFG)
    with pytest.raises(EnvLoadError, match="eval_size must be a positive integer"):
        adapter.load("chain_sum", {"eval_size": 0}, CFG)
    with pytest.raises(EnvLoadError, match="system_prompt must be text"):
        adapter.load("chain_sum", {"system_prompt": ["x"]}, CFG)


def test_bad_row() -> None:
    provider = adapter.load("chain_sum", CHAIN, CFG)
    with pytest.raises(ValueError, match="needs 'question' and 'answer'.*'prompt'"):
        answer(provider, {"prompt": "1 + 1 ="}, "")


def test_available_and_missing_library(monkeypatch: pytest.MonkeyPatch) -> None:
    listed = dict(adapter.available())
    assert listed["chain_sum"].startswith("reasoning_gym.arithmetic") and "composite" in listed
    for name in ("reasoning_gym", "reasoning_gym.factory"):
        monkeypatch.setitem(sys.modules, name, None)
    assert adapter.available() == []
    with pytest.raises(EnvLoadError, match=r"pip install 'slimecli\[reasoning-gym\]'"):
        adapter.load("chain_sum", {}, CFG)


def test_adapter_import_does_not_import_the_library() -> None:
    code = "import sys, slimecli.env.adapters.reasoning_gym; assert 'reasoning_gym' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])
