"""pass@k against brute-force counting, and a dataset's metrics from scored attempts."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest

from slimecli.eval.passk import mean_pass_at_k, pass_at_k, powers_of_two
from slimecli.eval.scoring import Outcome, dataset_metrics, sample_row
from slimecli.rollout.sample import Sample, Status


def brute_force(n: int, c: int, k: int) -> Fraction:
    """The share of all k-subsets of n samples (the first c passing) that hold at least one pass."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(i < c for i in s) for s in subsets), len(subsets))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 10])
def test_pass_at_k_matches_brute_force(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(brute_force(n, c, k)), abs=1e-12), (n, c, k)


def test_pass_at_1_is_the_pass_rate_and_bounds():
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    assert pass_at_k(8, 0, 8) == 0.0 and pass_at_k(8, 1, 8) == 1.0
    for bad in [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_powers_of_two_and_mean_over_prompts():
    assert powers_of_two(1) == [1] and powers_of_two(8) == [1, 2, 4, 8] and powers_of_two(12) == [1, 2, 4, 8]
    assert mean_pass_at_k([(4, 1), (4, 0)], 2) == pytest.approx((pass_at_k(4, 1, 2) + 0.0) / 2)
    assert mean_pass_at_k([(4, 1), (1, 1)], 2) == pytest.approx(pass_at_k(4, 1, 2))  # too few samples: left out
    assert mean_pass_at_k([(1, 1)], 2) is None


def outcome(prompt: int, j: int, value: float | None, length: int = 3, reward=None) -> Outcome:
    s = Sample(prompt=f"p{prompt}", response="X" * length, response_length=length, status=Status.COMPLETED,
               reward=value if reward is None else reward)
    return Outcome(prompt, j, {"prompt": f"p{prompt}", "label": None, "metadata": {}}, [s], value,
                   None if value is not None else "reward_error: boom")


def test_dataset_metrics():
    outcomes = [outcome(0, 0, 1.0), outcome(0, 1, 0.5), outcome(0, 2, 0.0, 5), outcome(0, 3, None),
                outcome(1, 0, 1.0), outcome(1, 1, 1.0), outcome(1, 2, 0.0), outcome(1, 3, 0.0)]
    m = dataset_metrics(outcomes, 4, threshold=1.0)
    assert m["reward_mean"] == pytest.approx(3.5 / 7)
    assert m["invalid"] == pytest.approx(1 / 8)
    assert m["response_len_mean"] == pytest.approx((3 * 7 + 5) / 8)
    assert (m["prompts"], m["samples"]) == (2, 8)
    # prompt 0 has 3 valid samples (1 pass), prompt 1 has 4 (2 passes); pass@4 only from prompt 1
    assert m["pass@1"] == pytest.approx((1 / 3 + 2 / 4) / 2)
    assert m["pass@2"] == pytest.approx((pass_at_k(3, 1, 2) + pass_at_k(4, 2, 2)) / 2)
    assert m["pass@4"] == pytest.approx(pass_at_k(4, 2, 4))
    assert "pass@8" not in m and "resolved_rate" not in m
    assert dataset_metrics(outcomes, 4, threshold=0.5)["pass@1"] == pytest.approx((2 / 3 + 2 / 4) / 2)


def test_swe_metrics_are_the_resolved_rate_and_pass_at_k():
    def run(prompt, j, resolved):
        return outcome(prompt, j, float(resolved), reward={"resolved": resolved, "f2p": 1.0 * resolved, "reward": 0.0})

    outcomes = [run(0, 0, 1), run(0, 1, 0), run(1, 0, 0), run(1, 1, 0), outcome(1, 2, None)]
    m = dataset_metrics(outcomes, 2, threshold=1.0, swe=True)
    assert m["resolved_rate"] == pytest.approx(1 / 4) and m["reward_mean"] == pytest.approx(1 / 4)
    assert m["pass@2"] == pytest.approx((1.0 + 0.0) / 2) and m["invalid"] == pytest.approx(1 / 5)


def test_sample_row_is_json_ready():
    row = sample_row(outcome(2, 1, 1.0, reward={"resolved": 1}), threshold=1.0)
    assert row["prompt_index"] == 2 and row["passed"] is True and row["reward"] == {"resolved": 1}
    assert row["status"] == "completed" and row["invalid"] is None
