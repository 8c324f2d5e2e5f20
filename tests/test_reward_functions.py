"""Built-in reward functions on real answers, and the registry other modules extend."""

from __future__ import annotations

import pytest

from slimecli.reward import registry
from slimecli.reward.functions import exact_match, exact_match_score, f1, f1_score
from slimecli.reward.math_answer import extract_answer, math_reward, math_score, normalize_answer
from slimecli.reward.registry import UnknownRewardError, get_reward, register_reward, reward_names, scoped_rewards
from slimecli.rollout.sample import Sample


@pytest.mark.parametrize("response,label", [
    ("So the probability is \\boxed{\\frac{1}{2}}.", "0.5"),
    ("$\\boxed{\\dfrac12}$", "1/2"),
    ("\\boxed{\\tfrac{3}{4}}", "\\frac{3}{4}"),
    ("The final answer is $\\frac {3}{4}$.", "0.75"),
    ("We get \\boxed{ 1,000 }", "1000"),
    ("Answer: 3.0", "3"),
    ("Natalia sold 48/2 = 24 clips in May.\n#### 72", "#### 72"),
    ("\\boxed{50\\%}", "50"),
    ("\\boxed{x = 5}", "5"),
    ("\\boxed{-\\frac{2}{4}}", "-0.5"),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}"),
    ("\\boxed{\\left( 1, 2 \\right)}", "(1,2)"),
    ("\\boxed{10^\\circ}", "10"),
    ("\\boxed{\\$5}", "5"),
    ("\\boxed{\\text{(B)}}", "(B)"),
    ("first \\boxed{1} then corrected: \\boxed{2}", "2"),
    ("\\boxed{\\frac{a+1}{b}}", "\\frac{a + 1}{b}"),
    ("\\boxed{5}", ["five", "5"]),
])
def test_math_equivalent_answers_score_one(response, label):
    assert math_score(response, label) == 1.0


@pytest.mark.parametrize("response,label", [
    ("\\boxed{41}", "42"),
    ("I think it is 42", "42"),  # no stated final answer: listing numbers must not pay
    ("\\boxed{\\frac{1}{3}}", "0.33"),
    ("\\boxed{1,2}", "12"),  # a pair, not a thousands separator
    ("\\boxed{}", "0"),
    ("\\boxed{2}", None),
    ("\\boxed{\\frac{1}{0}}", "1"),
])
def test_math_wrong_or_missing_answers_score_zero(response, label):
    assert math_score(response, label) == 0.0


def test_math_extraction_and_normalisation_details():
    assert extract_answer("a \\boxed{\\frac{1}{2}} b") == "\\frac{1}{2}"
    assert extract_answer("nested \\boxed{\\sqrt{\\frac{1}{4}}} end") == "\\sqrt{\\frac{1}{4}}"
    assert extract_answer("no answer here") is None
    assert normalize_answer("$0.50$") == "1/2"
    assert normalize_answer("\\frac{6}{4}") == "3/2"
    assert normalize_answer("1,234,567.0") == "1234567"
    sample = Sample(prompt="1+1?", response="It is \\boxed{2}.", label="2")
    assert math_reward(sample) == 1.0


def test_exact_match_and_f1_on_real_answers():
    assert exact_match_score("  The Eiffel Tower. ", "eiffel tower") == 1.0
    assert exact_match_score("Paris, France", "Paris") == 0.0
    assert exact_match_score("paris", ["London", "Paris"]) == 1.0
    assert exact_match_score("anything", None) == 0.0
    assert f1_score("the cat sat on the mat", "a cat sat on a mat") == 1.0
    assert f1_score("Barack Obama", "Obama") == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert f1_score("red green", "blue") == 0.0
    assert f1_score("red green", ["blue", "green"]) == pytest.approx(2 / 3)
    assert f1_score("", "") == 1.0
    sample = Sample(response="Obama", label="Barack Obama")
    assert exact_match(sample) == 0.0 and f1(sample) == pytest.approx(2 / 3)


def test_registry_builtins_and_registration(monkeypatch):
    assert {"exact_match", "math", "f1", "remote", "python", "quickstart", "swe_tests"} <= set(reward_names())
    assert get_reward("math").fn is math_reward
    from slimecli.rollout.quickstart import quickstart_reward

    assert get_reward("quickstart").fn is quickstart_reward  # imported on first use

    def my_group(samples):
        return [1.0] * len(samples)

    with scoped_rewards():
        register_reward("test_registry_group", my_group, group=True)
        spec = get_reward("test_registry_group")
        assert spec.fn is my_group and spec.group
        assert "test_registry_group" in reward_names()
    assert "test_registry_group" not in reward_names()  # the scope undid the registration
    with pytest.raises(UnknownRewardError, match="did you mean 'math'"):
        get_reward("mathh")
    with registry.REWARDS.scoped():  # a package's lazy declaration: listed at once, imported on first use
        registry.REWARDS.builtin("registered_later", "slimecli.no_such_module:fn")
        assert "registered_later" in reward_names()
        with pytest.raises(ModuleNotFoundError, match="slimecli.no_such_module"):
            get_reward("registered_later")
    assert "registered_later" not in reward_names()
    with pytest.raises(ValueError, match="built from the config"):
        register_reward("remote", my_group)
    with pytest.raises(TypeError):
        register_reward("not_callable", 3)
