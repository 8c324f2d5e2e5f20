"""Reward assignment with user python rewards: dicts, strings, exceptions, async, hangs, group rewards,
and the priority between per-sample paths, the configured function and metadata types."""

from __future__ import annotations

import asyncio
import logging
import textwrap
from pathlib import Path

import pytest

from slimecli.config.groups.reward import RewardConfig
from slimecli.reward import apply_invalid_policy, assign_rewards, register_reward, reward_metrics
from slimecli.reward.registry import scoped_rewards
from slimecli.rollout.sample import Sample


@pytest.fixture(autouse=True)
def _registrations_stay_in_their_test():
    """The rewards a test registers are gone after it."""
    with scoped_rewards():
        yield


USER_REWARDS = textwrap.dedent('''
    import asyncio
    import time

    def per_sample(sample):
        mode = sample.metadata.get("mode", "ok")
        if mode == "dict":
            return {"score": 0.5, "acc": True, "pred": "42"}
        if mode == "string":
            return "great answer"
        if mode == "raise":
            raise ValueError(f"cannot score sample {sample.index}")
        if mode == "hang":
            time.sleep(2)
        return 1.0

    async def async_reward(sample):
        await asyncio.sleep(0)
        return {"score": float(len(sample.response))}

    async def async_hang(sample):
        await asyncio.sleep(60)

    def returns_coroutine(sample):
        return async_reward(sample)

    def group_rank(samples):
        return [float(i) for i, _ in enumerate(samples)]

    def group_wrong_length(samples):
        return [1.0]

    def seen(sample):
        return "path:" + sample.metadata.get("tag", "")
''')


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    path = tmp_path / "user_rewards.py"
    path.write_text(USER_REWARDS)
    return path


def run(samples, cfg, log=None):
    asyncio.run(assign_rewards(samples, cfg, log or logging.getLogger("test_reward")))
    return samples


def make(n: int, group_size: int = 1, **meta) -> list[Sample]:
    return [Sample(index=i, group_index=i // group_size, response="x" * (i + 1), label="x", metadata=dict(meta))
            for i in range(n)]


def test_python_reward_dicts_strings_and_raises(user_file, caplog):
    samples = make(6)
    for s, mode in zip(samples, ["ok", "dict", "string", "raise", "raise", "raise"], strict=True):
        s.metadata["mode"] = mode
    cfg = RewardConfig(name="python", path=f"{user_file}:per_sample", key="score")
    with caplog.at_level(logging.INFO, logger="test_reward"):
        run(samples, cfg)
    assert [s.reward for s in samples[:3]] == [1.0, {"score": 0.5, "acc": True, "pred": "42"}, "great answer"]
    for s in samples[3:]:
        assert s.reward is None and s.metadata["reward_error"] == "ValueError"
        assert f"cannot score sample {s.index}" in s.metadata["reward_error_detail"]
    tracebacks = [r for r in caplog.records if "Traceback" in r.getMessage()]
    assert len(tracebacks) == 1 and "cannot score sample 3" in tracebacks[0].getMessage()
    assert any("3 of 6 samples have no reward" in r.getMessage() and "ValueError x3" in r.getMessage()
               for r in caplog.records)

    m = reward_metrics(samples, key="score")
    assert (m["reward/valid"], m["reward/invalid"]) == (2, 4)
    assert m["reward/invalid/reward_error"] == 3 and m["reward/invalid/string"] == 1
    assert m["reward/mean"] == 0.75 and m["reward/key/score/mean"] == 0.5 and m["reward/key/acc/mean"] == 1.0
    assert apply_invalid_policy(samples, key="score").rewards == [1.0, 0.5, 0.0, 0.0, 0.0, 0.0]

    # a second step with the same failure: the traceback is not logged again, the stale error is cleared
    caplog.clear()
    samples[3].metadata["mode"] = "ok"
    with caplog.at_level(logging.INFO, logger="test_reward"):
        run(samples, cfg)
    assert samples[3].reward == 1.0 and "reward_error" not in samples[3].metadata
    assert samples[4].metadata["reward_error"] == "ValueError"
    assert not any("Traceback" in r.getMessage() for r in caplog.records)


def test_async_and_coroutine_returning_rewards(user_file):
    samples = run(make(3), RewardConfig(name="python", path=f"{user_file}:async_reward"))
    assert [s.reward for s in samples] == [{"score": 1.0}, {"score": 2.0}, {"score": 3.0}]
    samples = run(make(2), RewardConfig(name="python", path=f"{user_file}:returns_coroutine"))
    assert [s.reward for s in samples] == [{"score": 1.0}, {"score": 2.0}]


def test_slow_rewards_time_out_without_stopping_the_others(user_file, caplog):
    samples = make(3)
    samples[1].metadata["mode"] = "hang"
    with caplog.at_level(logging.INFO, logger="test_reward"):
        run(samples, RewardConfig(name="python", path=f"{user_file}:per_sample", timeout_s=0.3))
    assert samples[0].reward == 1.0 and samples[2].reward == 1.0
    assert samples[1].reward is None and samples[1].metadata["reward_error"] == "TimeoutError"
    assert any("exceeded reward.timeout_s=0.3" in r.getMessage() for r in caplog.records)

    samples = run(make(2), RewardConfig(name="python", path=f"{user_file}:async_hang", timeout_s=0.2))
    assert [s.metadata["reward_error"] for s in samples] == ["TimeoutError", "TimeoutError"]


def test_group_rewards_get_whole_groups(user_file):
    samples = make(6, group_size=3)
    run(samples, RewardConfig(name="python", path=f"{user_file}:group_rank", group=True))
    assert [s.reward for s in samples] == [0.0, 1.0, 2.0, 0.0, 1.0, 2.0]
    samples = run(make(4, group_size=2), RewardConfig(name="python", path=f"{user_file}:group_wrong_length",
                                                         group=True))
    assert all(s.metadata["reward_error"] == "RewardShapeError" for s in samples)
    assert "must return 2 rewards" in samples[0].metadata["reward_error_detail"]

    def registered_group(group):
        return [len(group)] * len(group)

    register_reward("test_python_group", registered_group, group=True)
    samples = run(make(5, group_size=2), RewardConfig(name="test_python_group"))
    assert [s.reward for s in samples] == [2, 2, 2, 2, 1]


def test_priority_path_then_function_then_metadata_type_then_name(user_file):
    register_reward("test_priority_meta", lambda s: "meta")
    register_reward("test_priority_name", lambda s: "name")
    samples = make(4)
    samples[0].metadata.update(reward_path=f"{user_file}:seen", tag="own", rm_type="test_priority_meta")
    samples[1].metadata.update(rm_type="test_priority_meta")
    run(samples, RewardConfig(name="python", path=f"{user_file}:seen"))
    assert [s.reward for s in samples] == ["path:own", "path:", "path:", "path:"]

    samples = make(3)
    samples[0].metadata.update(reward_path=f"{user_file}:seen", tag="own")
    samples[1].metadata.update(rm_type="test_priority_meta")
    run(samples, RewardConfig(name="test_priority_name"))
    assert [s.reward for s in samples] == ["path:own", "meta", "name"]


def test_builtin_rewards_through_assign_rewards_and_unresolvable_sources(tmp_path, caplog):
    samples = [Sample(index=0, response="\\boxed{\\frac{1}{2}}", label="0.5"),
               Sample(index=1, response="It is 0.5", label="0.5"),
               Sample(index=2, response="0.5", label="0.5", metadata={"rm_type": "exact_match"}),
               Sample(index=3, response="x", metadata={"rm_type": "no_such_reward"}),
               Sample(index=4, response="x", metadata={"reward_path": f"{tmp_path}/missing.py:f"}),
               Sample(index=5, reward=0.0, remove_sample=True, metadata={"abort_reason": "agent crashed"})]
    with caplog.at_level(logging.INFO, logger="test_reward"):
        run(samples, RewardConfig(name="math"))
    assert [s.reward for s in samples[:3]] == [1.0, 0.0, 1.0]
    assert samples[3].metadata["reward_error"] == "UnknownRewardError"
    assert "unknown reward 'no_such_reward'" in samples[3].metadata["reward_error_detail"]
    assert samples[4].metadata["reward_error"] == "FileNotFoundError"
    assert samples[5].reward == 0.0 and "reward_error" not in samples[5].metadata
    assert any("no_such_reward" in r.getMessage() for r in caplog.records)


def test_concurrency_limits_reward_calls_in_flight():
    import threading
    import time

    lock, state = threading.Lock(), {"now": 0, "max": 0}

    def busy(sample):
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        time.sleep(0.02)
        with lock:
            state["now"] -= 1
        return 1.0

    register_reward("test_busy", busy)
    samples = run(make(10), RewardConfig(name="test_busy", concurrency=2))
    assert [s.reward for s in samples] == [1.0] * 10
    assert 1 <= state["max"] <= 2


def test_inline_rewards_run_on_the_event_loop_and_fail_per_sample(caplog):
    """inline=True: scored in the loop's own thread (no worker thread, no task each); a raise or a group of
    the wrong length marks only the samples it scored."""
    import threading

    threads = set()

    def inline(sample):
        threads.add(threading.get_ident())
        if sample.index == 2:
            raise ValueError("no score for 2")
        return float(sample.index)

    def inline_group(group):
        return [1.0] * (len(group) if group[0].group_index == 0 else len(group) + 1)

    register_reward("test_inline", inline, inline=True)
    register_reward("test_inline_group", inline_group, group=True, inline=True)

    async def scored(samples, cfg):
        await assign_rewards(samples, cfg, logging.getLogger("test_reward"))
        return threading.get_ident(), samples

    loop_thread, samples = asyncio.run(scored(make(4), RewardConfig(name="test_inline")))
    assert threads == {loop_thread}
    assert [s.reward for s in samples] == [0.0, 1.0, None, 3.0]
    assert samples[2].metadata["reward_error"] == "ValueError" and "no score for 2" in caplog.text
    _, samples = asyncio.run(scored(make(4, group_size=2), RewardConfig(name="test_inline_group")))
    assert [s.reward for s in samples[:2]] == [1.0, 1.0]
    assert all(s.metadata["reward_error"] == "RewardShapeError" for s in samples[2:])
