"""The environment rollout's episode loop with the tiny model's real tokenizer and chat template, a scripted policy
(the turns' texts are fixed so that each case is reached) and environments written to the native protocol: tokens
in and tokens out (every turn's prompt extends the last, the sampled ids and log-probs are kept exactly, the loss
covers them only), and every bad input drops the episode with its reason while the loop goes on."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from slimecli.config.groups.env import EnvConfig
from slimecli.env.builtin.lookup import LookupEnv
from slimecli.env.episode import EpisodeRunner
from slimecli.env.protocol import Action, Observation, StepResult
from slimecli.env.rollout import episode_metrics, stop_ids
from slimecli.model.tool_calls import HermesToolParser
from slimecli.rollout.sample import Sample, Status


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    from slimecli.config.groups.model import ModelConfig
    from slimecli.model.loading import resolve_model_path

    return AutoTokenizer.from_pretrained(str(resolve_model_path(ModelConfig())))


class Policy:
    """Answers each turn with the next scripted text (ending in <|im_end|>), recording the prompts it was sent."""

    def __init__(self, tokenizer: Any, texts: list[str], end: bool = True) -> None:
        self.tokenizer, self.texts, self.end = tokenizer, list(texts), end
        self.prompts: list[list[int]] = []
        self.sampled: list[list[int]] = []

    async def __call__(self, ids: list[int], max_new_tokens: int, turn: int, extra: dict[str, Any]) -> dict[str, Any]:
        self.prompts.append(list(ids))
        out = self.tokenizer.encode(self.texts[turn], add_special_tokens=False)
        if self.end:
            out.append(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        out = out[:max_new_tokens]
        self.sampled.append(out)
        finish = "stop" if len(out) < max_new_tokens or self.end else "length"
        return {"text": "", "meta_info": {"output_token_logprobs": [[-0.25 - 0.01 * i, t, None]
                                                                   for i, t in enumerate(out)],
                                          "finish_reason": {"type": finish}, "prompt_tokens": len(ids),
                                          "cached_tokens": 0, "weight_version": "3"}}


def runner(tokenizer: Any, **env: Any) -> EpisodeRunner:
    cfg = EnvConfig(name="native", id="x", **{"timeout_s": 2.0, **env})
    return EpisodeRunner(cfg, tokenizer, HermesToolParser(), stop_ids(tokenizer), 64)


def play(tokenizer: Any, env: Any, texts: list[str], task: dict[str, Any] | None = None, **cfg: Any
         ) -> tuple[Sample, Policy]:
    policy = Policy(tokenizer, texts)
    sample = Sample(prompt="p", group_index=0, index=7, metadata={"source": "t"})
    out = asyncio.run(runner(tokenizer, **cfg).run(env, task or {"secret": "moon"}, policy, sample))
    return out, policy


LOOKUP = '<tool_call>\n{"name": "lookup", "arguments": {}}\n</tool_call>'
ANSWER = '<tool_call>\n{"name": "answer", "arguments": {"word": "moon"}}\n</tool_call>'


def test_tokens_in_tokens_out_over_several_turns(tokenizer: Any) -> None:
    sample, policy = play(tokenizer, LookupEnv(), [LOOKUP, ANSWER])
    assert sample.status == Status.COMPLETED and sample.reward == 1.0 and not sample.remove_sample
    first, second = policy.prompts
    assert second[:len(first)] == first  # the next prompt extends the last: no re-tokenized history
    assert second[len(first):len(first) + len(policy.sampled[0])] == policy.sampled[0]  # sampled ids kept as is
    assert sample.tokens[:len(second)] == second and sample.tokens[len(second):] == policy.sampled[1]
    assert sample.prompt_length == len(first)
    # the loss covers exactly the sampled tokens, with their log-probs; the observation between them is context
    mask, logps = sample.loss_mask, sample.rollout_log_probs
    n0, n1 = len(policy.sampled[0]), len(policy.sampled[1])
    assert mask[:n0] == [1] * n0 and mask[-n1:] == [1] * n1 and set(mask[n0:-n1]) == {0}
    assert sum(mask) == n0 + n1 and len(mask) == sample.response_length == len(logps)
    assert logps[:n0] == pytest.approx([-0.25 - 0.01 * i for i in range(n0)])
    obs_text = tokenizer.decode(sample.tokens[len(first) + n0:len(second)])
    assert "<tool_response>\nmoon\n" in obs_text and obs_text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert sample.metadata["turns"] == 2 and sample.metadata["tool_calls"] == {"lookup": 1, "answer": 1}
    assert sample.weight_versions == ["3", "3"]


def test_rendering_matches_the_chat_template_of_the_whole_conversation(tokenizer: Any) -> None:
    """The appended observation renders what the template renders for the conversation as a whole."""
    sample, policy = play(tokenizer, LookupEnv(), [LOOKUP, ANSWER])
    env = LookupEnv()
    messages = [*asyncio.run(env.reset({"secret": "moon"})).messages,
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_0", "type": "function", "function": {"name": "lookup", "arguments": {}}}]},
                {"role": "tool", "tool_call_id": "call_0", "content": "\n".join(["moon"] * env.repeat)}]
    whole = tokenizer.apply_chat_template(messages, tools=env.tools(), add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(policy.prompts[1]) == whole


class Scripted:
    """A native environment whose step misbehaves as told."""

    def __init__(self, step: Any, tools: list[dict[str, Any]] | None = None) -> None:
        self._step, self.tools, self.closed = step, tools, False

    async def reset(self, task: Any) -> Observation:
        return Observation([{"role": "user", "content": "go"}], self.tools)

    async def step(self, action: Action) -> Any:
        return await self._step(action)

    async def close(self) -> None:
        self.closed = True


async def _raise(action: Action) -> Any:
    raise RuntimeError("env bug")


async def _hang(action: Action) -> Any:
    await asyncio.sleep(30)


async def _nan(action: Action) -> Any:
    return StepResult(reward=math.nan, done=True)


async def _text_reward(action: Action) -> Any:
    return StepResult(reward="1.0", done=True)  # type: ignore[arg-type]


async def _bad_messages(action: Action) -> Any:
    return StepResult(Observation([{"content": "no role"}]))


async def _not_a_result(action: Action) -> Any:
    return {"reward": 1.0}


async def _never_done(action: Action) -> Any:
    return StepResult(Observation([{"role": "user", "content": "more " * 40}]), reward=0.25)


@pytest.mark.parametrize("step,reason", [(_raise, "env_error"), (_hang, "timeout"), (_nan, "bad_reward"),
                                         (_text_reward, "bad_reward"), (_bad_messages, "bad_observation"),
                                         (_not_a_result, "bad_observation")])
def test_a_misbehaving_environment_drops_the_episode_with_its_reason(tokenizer: Any, step: Any, reason: str) -> None:
    env = Scripted(step)
    sample, _ = play(tokenizer, env, ["hello", "again"], timeout_s=0.5)
    assert sample.remove_sample and sample.status == Status.ABORTED
    assert sample.metadata["drop_reason"] == reason and sample.metadata["drop_detail"]
    assert sample.effective_loss_mask() == [0] * sample.response_length  # nothing of it trains
    assert env.closed  # closed all the same


def test_unknown_tool_and_budget_overrun_drop_and_ill_formed_calls_are_answered(tokenizer: Any) -> None:
    unknown, _ = play(tokenizer, LookupEnv(), ['<tool_call>\n{"name": "rm", "arguments": {}}\n</tool_call>'])
    assert unknown.metadata["drop_reason"] == "unknown_tool" and "'rm'" in unknown.metadata["drop_detail"]
    over, _ = play(tokenizer, Scripted(_never_done), ["a b c"] * 8, max_tokens_per_episode=60)
    assert over.metadata["drop_reason"] == "budget_exceeded"
    broken = '<tool_call>\n{"name": "lookup", "arguments": </tool_call>'
    sample, policy = play(tokenizer, LookupEnv(), [broken, LOOKUP, ANSWER])
    assert not sample.remove_sample and sample.reward == 1.0 and sample.metadata["tool_errors"] == 1
    assert "could not be parsed" in tokenizer.decode(policy.prompts[1][len(policy.prompts[0]):])


def test_the_turn_limit_ends_the_episode_with_what_it_earned(tokenizer: Any) -> None:
    sample, policy = play(tokenizer, Scripted(_never_done), ["x", "y", "z", "w"], max_turns=3)
    assert sample.status == Status.TRUNCATED and sample.metadata["turn_limit"] and not sample.remove_sample
    assert len(policy.prompts) == 3 and sample.reward == pytest.approx(0.75)


def test_per_source_metrics_count_drops_by_reason(tokenizer: Any) -> None:
    good, _ = play(tokenizer, LookupEnv(), [LOOKUP, ANSWER])
    wrong, _ = play(tokenizer, LookupEnv(), [ANSWER])  # answered without looking: no reward
    dropped, _ = play(tokenizer, Scripted(_raise), ["x"])
    metrics = episode_metrics([good, wrong, dropped])
    assert metrics["env/t/episodes"] == 3 and metrics["env/t/reward"] == 0.5
    assert metrics["env/t/dropped/env_error"] == 1 and metrics["env/t/dropped"] == 1
    assert metrics["env/t/tool_calls/answer"] == 1.0 and metrics["env/t/turns"] == 1.5
