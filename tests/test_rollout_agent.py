"""The agent rollout kind with a scripted run_task: retries, masking, group refill, metrics, and the training
side it feeds (group statistics without removed runs, one weight per run however many samples it forked into)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math

import pytest

from slimecli.agent.training import collector as agent_rollout
from slimecli.config.compose import load
from slimecli.config.errors import ConfigErrors
from slimecli.launch.source_checks import load as preflight_load
from slimecli.rollout.data import PromptSource
from slimecli.rollout.sample import Sample, Status

GRADE_OK = {"resolved": 1, "f2p": 1.0, "p2p": 1.0, "applied": 1, "touched_tests": 0, "reward": 1.0}
GRADE_NO = {"resolved": 0, "f2p": 0.5, "p2p": 1.0, "applied": 1, "touched_tests": 1, "reward": 0.0}
GRADE_EMPTY = {"resolved": 0, "f2p": 0.0, "p2p": 1.0, "applied": 0, "touched_tests": 0, "reward": 0.0}


def config(*overrides: str):
    base = ["+recipe=swe_agent", "rollout.batch_size=2", "rollout.n_samples_per_prompt=2",
            "trainer.global_batch_size=4"]
    return load([*base, *overrides])


def ok(grade: dict, branches: int = 1, turns: int = 2, diff: str = "--- a/x\n+++ b/x\n"):
    def make(base: Sample) -> list[Sample]:
        return [dataclasses.replace(base, tokens=[1, 2, 3, 4], response_length=2, loss_mask=[1, 1],
                                    rollout_log_probs=[-0.5, -0.5], reward=dict(grade), status=Status.COMPLETED,
                                    session_id="s", metadata={**base.metadata, "turns": turns, "branch": b,
                                                              "num_branches": branches, "diff": diff})
                for b in range(branches)]
    return make


def abort(reason: str):
    def make(base: Sample) -> list[Sample]:
        return [Sample.aborted(reason, prompt=base.prompt, group_index=base.group_index, index=base.index,
                               rollout_id=base.rollout_id, metadata=dict(base.metadata))]
    return make


class Script:
    """run_task stand-in: outcome by (sample index, attempt); records every call."""

    def __init__(self, outcomes: dict[tuple[int, int], object], default=None):
        self.outcomes = outcomes
        self.default = default or ok(GRADE_OK)
        self.calls: list[tuple[int, int, int]] = []  # (index, attempt, rollout_id)

    async def __call__(self, service, job, *, base_sample: Sample, **_):
        attempt = base_sample.metadata["attempt"]
        self.calls.append((base_sample.index, attempt, base_sample.rollout_id))
        await asyncio.sleep(0)
        return self.outcomes.get((base_sample.index, attempt), self.default)(base_sample)


def collect(cfg, script: Script, monkeypatch):
    monkeypatch.setattr(agent_rollout, "run_task", script)
    source = PromptSource(cfg.task, cfg.run.seed)
    collector = agent_rollout.AgentRollout(cfg, service=None, source=source, job_factory=lambda task: task)
    return asyncio.run(collector.collect()), source


def test_successful_runs_fill_the_batch_with_graded_samples(monkeypatch):
    cfg = config()
    # run 1 forked into 3 samples (one per trajectory branch); runs 2 and 3 unresolved; run 3 an empty diff
    script = Script({(1, 0): ok(GRADE_OK, branches=3, turns=1), (2, 0): ok(GRADE_NO),
                     (3, 0): ok(GRADE_EMPTY, diff="")})
    result, source = collect(cfg, script, monkeypatch)
    assert [s.index for s in result.samples] == [0, 1, 1, 1, 2, 3]
    assert [s.group_index for s in result.samples] == [0, 0, 0, 0, 1, 1]
    assert result.train_rewards == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]  # reward.key=resolved of the grade dict
    forked = [s for s in result.samples if s.index == 1]
    assert len({s.rollout_id for s in forked}) == 1 and all(s.reward == GRADE_OK for s in forked)
    assert len({s.rollout_id for s in result.samples}) == 4
    assert source.position == 2 and len(script.calls) == 4
    m = result.metrics
    assert m["swe/resolved_rate"] == 0.5 and m["swe/f2p_frac"] == pytest.approx(0.625)
    assert m["swe/p2p_frac"] == 1.0 and m["swe/patch_applied_rate"] == 0.75
    assert m["swe/empty_patch_rate"] == 0.25 and m["swe/touched_tests"] == 0.25
    assert m["agent/turns_mean"] == pytest.approx((2 + 3 + 2 + 2) / 4)  # a run's turns over its branches
    assert m["agent/retries"] == 0 and m["rollout/groups_generated"] == 2
    assert m["agent/run_s_p50"] >= 0 and m["agent/run_s_p95"] >= m["agent/run_s_p50"]
    assert not any(k.startswith("agent/abort_rate/") for k in m)


def test_forked_run_weighs_as_much_as_a_single_sample_run(monkeypatch):
    from slimecli.train.losses import loss_weights

    cfg = config()
    result, _ = collect(cfg, Script({(1, 0): ok(GRADE_OK, branches=3)}), monkeypatch)
    weights = loss_weights(result.samples, cfg.trainer.loss_reduction)
    per_run: dict[int, float] = {}
    for s, w in zip(result.samples, weights, strict=True):
        per_run[s.rollout_id] = per_run.get(s.rollout_id, 0.0) + float(w.sum())
    assert sorted(per_run.values()) == pytest.approx([0.25] * 4)  # 4 runs, each 1/4 of the step's loss


def test_infrastructure_abort_is_retried_in_a_fresh_run(monkeypatch):
    cfg = config()
    script = Script({(0, 0): abort("exception:RuntimeError"), (0, 1): abort("adapter_session_empty"),
                     (2, 0): abort("unevaluatable:sandbox")})
    result, _ = collect(cfg, script, monkeypatch)
    assert [(i, a) for i, a, _ in sorted(script.calls)] == [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (2, 1), (3, 0)]
    assert len({rid for _, _, rid in script.calls}) == 7  # every attempt is a new run
    assert all(not s.remove_sample for s in result.samples) and result.train_rewards == [1.0] * 4
    m = result.metrics
    assert m["agent/retries"] == 3
    assert m["agent/abort_rate/exception:RuntimeError"] == pytest.approx(1 / 7)
    assert m["agent/abort_rate/unevaluatable:sandbox"] == pytest.approx(1 / 7)


def test_timeout_is_masked_not_retried_and_left_out_of_the_group_statistics(monkeypatch):
    from slimecli.train.advantages import compute_advantages

    cfg = config("rollout.n_samples_per_prompt=3", "trainer.global_batch_size=6")
    script = Script({(0, 0): ok(GRADE_NO), (2, 0): abort("wall_clock_timeout")})
    result, _ = collect(cfg, script, monkeypatch)
    assert sorted((i, a) for i, a, _ in script.calls) == [(i, 0) for i in range(6)]
    masked = result.samples[2]
    assert masked.remove_sample and masked.metadata["abort_reason"] == "wall_clock_timeout"
    assert result.metrics["agent/abort_rate/wall_clock_timeout"] == pytest.approx(1 / 6)
    adv = compute_advantages(result.samples, result.train_rewards, cfg.trainer, cfg.rollout.n_samples_per_prompt)
    # group 0 over its two valid runs (0, 1): +-0.5 / (sqrt(0.5) + 1e-6); the masked run gets 0; group 1 agrees: 0
    s = math.sqrt(0.5) + 1e-6
    assert [a.tolist() for a in adv.advantages[:3]] == [pytest.approx([-0.5 / s] * 2), pytest.approx([0.5 / s] * 2),
                                                        [0.0]]
    assert all(a.abs().sum() == 0 for a in adv.advantages[3:])


def test_timeout_with_on_timeout_zero_counts_as_reward_zero(monkeypatch):
    from slimecli.train.advantages import compute_advantages

    cfg = config("agent.on_timeout=zero")
    script = Script({(0, 0): abort("wall_clock_timeout")})
    result, _ = collect(cfg, script, monkeypatch)
    zeroed = result.samples[0]
    assert not zeroed.remove_sample and zeroed.reward == 0.0 and result.train_rewards[:2] == [0.0, 1.0]
    adv = compute_advantages(result.samples, result.train_rewards, cfg.trainer, cfg.rollout.n_samples_per_prompt)
    s = math.sqrt(0.5) + 1e-6
    assert adv.advantages[1].tolist() == pytest.approx([0.5 / s] * 2)  # its sibling gains from the 0


def test_group_with_fewer_than_two_valid_runs_is_dropped_and_refilled(monkeypatch):
    cfg = config("rollout.batch_size=1", "trainer.global_batch_size=2")
    script = Script({(0, a): abort("cli_missing") for a in range(3)})  # retries exhausted: 1 valid run of 2
    result, source = collect(cfg, script, monkeypatch)
    assert [s.index for s in result.samples] == [2, 3] and [s.group_index for s in result.samples] == [1, 1]
    assert source.position == 2
    m = result.metrics
    assert m["rollout/dropped_few_valid_runs"] == 1 and m["rollout/groups_generated"] == 2
    assert m["agent/abort_rate/cli_missing"] == pytest.approx(3 / 6) and m["agent/retries"] == 2


def test_agent_rollouts_report_the_single_turn_rollout_metrics(monkeypatch):
    """One collect loop: the agent kind reports the shortest response, the truncated share and the speed too."""
    def truncated(base: Sample) -> list[Sample]:
        return [dataclasses.replace(s, tokens=[1, 2, 3], response_length=1, loss_mask=[1], rollout_log_probs=[-0.5],
                                    status=Status.TRUNCATED) for s in ok(GRADE_NO)(base)]

    result, _ = collect(config(), Script({(3, 0): truncated}), monkeypatch)
    m = result.metrics
    assert (m["rollout/samples"], m["rollout/response_len_min"], m["rollout/response_len_max"]) == (4, 1, 2)
    assert m["rollout/truncated_ratio"] == 0.25 and m["rollout/response_len_mean"] == 1.75
    assert m["rollout/tokens_per_s"] == pytest.approx(7 / m["rollout/time_s"])


def test_no_valid_group_at_all_stops_with_the_reasons(monkeypatch):
    cfg = config("rollout.batch_size=1", "trainer.global_batch_size=2", "agent.max_retries=0")
    with pytest.raises(RuntimeError, match="valid agent runs"):
        collect(cfg, Script({}, default=abort("context_limit")), monkeypatch)


def test_abort_kinds():
    kinds = {r: agent_rollout.abort_kind(r) for r in ("cli_missing", "exception:OSError", "unevaluatable:sandbox",
                                                      "wall_clock_timeout", "unevaluatable:budget")}
    assert kinds == {"cli_missing": "infra", "exception:OSError": "infra", "unevaluatable:sandbox": "infra",
                     "wall_clock_timeout": "model", "unevaluatable:budget": "other"}
    assert agent_rollout.percentile([3.0, 1.0, 2.0, 10.0], 50) == 2.0
    assert agent_rollout.percentile([3.0, 1.0, 2.0, 10.0], 95) == 10.0


def test_swe_source_order_is_seeded_and_resumable():
    cfg = config()
    a, b = PromptSource(cfg.task, 1), PromptSource(cfg.task, 1)
    first = [r["task"].instance_id for r in a.next(25)]  # 20 tasks: the second epoch starts
    assert sorted(first[:20]) == sorted(t["task"].instance_id for t in PromptSource(cfg.task, 2).next(20))
    assert first != [r["task"].instance_id for r in PromptSource(cfg.task, 2).next(25)]
    b.load_state_dict({"position": 7})
    assert [r["task"].instance_id for r in b.next(3)] == first[7:10]
    record = a.next(1)[0]
    assert record["metadata"] == {"instance_id": record["task"].instance_id} and record["prompt"]


def test_swe_tests_passes_a_runs_grade_through():
    from slimecli.reward import assign_rewards, get_reward

    fn = get_reward("swe_tests").fn
    assert fn(Sample(reward=dict(GRADE_OK))) == GRADE_OK
    ungraded = Sample(reward=None)
    asyncio.run(assign_rewards([ungraded], config().reward, logging.getLogger("test")))
    assert ungraded.reward is None and ungraded.metadata["reward_error"] == "Ungraded"


def test_aborted_placeholder_packs_for_training():
    from slimecli.train.batch import pack

    packed = pack([Sample.aborted("cli_missing"), Sample(tokens=[1, 2, 3], response_length=1)], pad_id=0)
    assert packed.mask.tolist() == [[0.0], [1.0]]


def test_generate_rules():
    assert config().rollout.generate == "agent"
    with pytest.raises(ConfigErrors, match="did you mean 'agent'"):
        load(["rollout.generate=agnet"])
    with pytest.raises(ConfigErrors, match="works SWE tasks"):
        load(["rollout.generate=agent", "agent=codex"])
    with pytest.raises(ConfigErrors, match="per_rollout"):
        config("trainer.loss_reduction=per_token")
    assert load(["rollout.generate=no_such_pkg.mod:fn"]).rollout.generate == "no_such_pkg.mod:fn"  # the text is well-formed
    with pytest.raises(ConfigErrors, match="rollout.generate: cannot find the rollout function: module no_such_pkg.mod "
                                           "not found on the Python path"):
        preflight_load(["rollout.generate=no_such_pkg.mod:fn"])  # whether it is there: pre-flight
    with pytest.raises(ConfigErrors, match="rollout.generate: cannot find the rollout function: 'mod:' has no "):
        load(["rollout.generate=mod:"])  # a malformed path: the config rule
    assert load(["rollout.generate=slimecli.agent.training.collector:AgentRollout"]).rollout.generate.endswith(":AgentRollout")
    with pytest.raises(ConfigErrors, match="did you mean 'mask'"):
        config("agent.on_timeout=maks")
    with pytest.raises(ConfigErrors, match="agent.max_retries"):
        config("agent.max_retries=-1")


def test_preflight_refuses_what_cannot_run(tmp_path):
    from slimecli.launch.agent_checks import agent_errors

    cfg = config()
    missing = dataclasses.replace(cfg, agent=dataclasses.replace(cfg.agent, binary=str(tmp_path / "claude")))
    (error,) = agent_errors(missing)
    assert "slimecli agent install claude_code" in error.hint
    single = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, generate="single_turn"))
    assert [e.path for e in agent_errors(single)] == ["rollout.generate"]
    assert agent_errors(load([])) == []
    # a window too small for the CLI's own prompt; codex's prompt is smaller than claude's
    small = dataclasses.replace(cfg, agent=dataclasses.replace(cfg.agent, max_context_len=7000, max_new_tokens=1024))
    (error,) = agent_errors(small)
    assert error.path == "agent.max_context_len" and "at least 6666 tokens" in error.reason
    codex = dataclasses.replace(small, agent=dataclasses.replace(small.agent, name="codex"))
    assert agent_errors(codex) == []
    # agent.tools: names the CLI has (a misspelt one would silently leave the model without it), a CLI that takes
    # a list; without the tool schemas the CLI's prompt fits that window
    only_bash = dataclasses.replace(small, agent=dataclasses.replace(small.agent, tools=("Bash",)))
    assert agent_errors(only_bash) == []
    typo = dataclasses.replace(cfg, agent=dataclasses.replace(cfg.agent, tools=("Bash", "Reed")))
    (error,) = agent_errors(typo)
    assert error.path == "agent.tools[1]" and error.value == "Reed" and "did you mean 'Read'?" in error.hint
    (error,) = agent_errors(dataclasses.replace(codex, agent=dataclasses.replace(codex.agent, tools=("Bash",))))
    assert error.path == "agent.tools" and "codex CLI takes no list" in error.reason
    # a sandbox runtime that is not there
    docker = dataclasses.replace(cfg, sandbox=dataclasses.replace(cfg.sandbox, name="docker",
                                                                    binary=str(tmp_path / "docker")))
    assert [e.path for e in agent_errors(docker)] == ["sandbox"]


def test_agent_tools_reach_the_claude_command_line(tmp_path):
    from slimecli.agent.harness.clis import ClaudeCodeHarness

    default = ClaudeCodeHarness().command("claude", "fix it", None)  # type: ignore[arg-type]
    assert "--tools" not in default
    only = ClaudeCodeHarness(tools=("Bash", "Read")).command("claude", "fix it", None)  # type: ignore[arg-type]
    assert only[-2:] == ["--tools", "Bash,Read"] and only[:3] == ["claude", "-p", "fix it"]
    none = ClaudeCodeHarness(tools=()).command("claude", "fix it", None)  # type: ignore[arg-type]
    assert none[-2:] == ["--tools", ""]


def test_rank0_puts_the_agent_service_in_front_of_the_first_engine(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from slimecli.agent.api import service as service_mod
    from slimecli.train.coordinator import RolloutCoordinator

    events = []

    class FakeService:
        name = "fake"
        base_url = "http://127.0.0.1:1"
        renderer = SimpleNamespace(decode_all=lambda ids: "")

        def __init__(self, cfg, port=None, engine_urls=None):
            events.append(("init", engine_urls, port))
            self.engine = SimpleNamespace(links=[SimpleNamespace(client=SimpleNamespace(recovery=None))
                                                 for _ in engine_urls])

        async def start(self):
            events.append(("start",))

        async def stop(self):
            events.append(("stop",))

    monkeypatch.setattr(service_mod, "AgentService", FakeService)
    side = RolloutCoordinator(config("rollout.port=30100", "rollout.num_engines=2"), tmp_path, tokenizer=None)
    assert isinstance(side.collector, agent_rollout.AgentRollout) and isinstance(side.collector.service, FakeService)
    assert side.collector.archive is not None and side.collector.archive.root == tmp_path / "agent"
    # the adapter's own engine clients wait out an engine's restart with the trainer's (train/coordinator/recovery.py)
    recovery = side.engines[0].recovery
    assert recovery is not None and [link.client.recovery for link in side.collector.service.engine.links] == [
        recovery, recovery]
    side.open_records(0, None)
    assert side.collector.on_progress == side.records.progress.note  # its live status goes on the progress line
    side.close()
    assert events == [("init", ["http://127.0.0.1:30100", "http://127.0.0.1:30101"], 0), ("stop",)]


@pytest.mark.parametrize("on_timeout", ["mask", "zero"])
def test_run_out_of_time_keeps_its_turns_only_with_on_timeout_zero(on_timeout, tmp_path):
    from types import SimpleNamespace

    from slimecli.agent.harness.clis import HarnessResult
    from slimecli.agent.harness.jobs import AgentJob
    from slimecli.agent.harness.task import run_task
    from slimecli.agent.trajectory.manager import TrajectoryManager, Turn

    manager = TrajectoryManager(stop_ids=[9], decode=lambda ids: " ".join(map(str, ids)))

    class OutOfTime:
        def __init__(self, **_):
            pass

        def sandbox_paths(self):
            return [], []

        async def run(self, sandbox, prompt, base_url, sid, budget):
            manager.begin_turn(sid)  # one turn reached the CLI before the budget ran out
            manager.end_turn(sid, Turn([1, 2], [5, 9], [-0.1, -0.2], "stop"))
            return HarnessResult(exit_code=None, timed_out=True, stdout="", stderr="", elapsed_s=budget)

    sandbox = SimpleNamespace(kind="fake", workdir=tmp_path, close=lambda: None)
    service = SimpleNamespace(
        cfg=SimpleNamespace(agent=SimpleNamespace(time_budget_s=1.0, on_timeout=on_timeout, binary=None,
                                                  tools_dir=None, tools=None)),
        name="fake", harness_cls=OutOfTime, adapter=SimpleNamespace(settings=SimpleNamespace(model_name="m")),
        renderer=SimpleNamespace(context_len=64), manager=manager, port=1, base_url="http://127.0.0.1:1",
        engine=SimpleNamespace(release=lambda sid: released.append(sid), assigned=lambda sid: 0),
        boots=asyncio.Semaphore(1))
    released: list[str] = []
    (s,) = asyncio.run(run_task(service, AgentJob("p"), base_sample=Sample(prompt="p", rollout_id=3),
                                sandbox_factory=lambda *_: sandbox))
    assert s.metadata["abort_reason"] == "wall_clock_timeout" and s.rollout_id == 3
    assert released == [s.session_id]  # the engine pool forgets the session on every way out
    if on_timeout == "zero":
        assert (s.tokens, s.loss_mask, s.reward, s.remove_sample) == ([1, 2, 5, 9], [1, 1], 0.0, False)
    else:
        assert s.remove_sample and s.status == Status.ABORTED


def test_each_update_takes_whole_rollouts_so_no_branch_is_left_untrained():
    from slimecli.train.stages import update_slices

    cfg = config("trainer.global_batch_size=2")
    runs = [1, 1, 1, 2, 3, 4, 4]  # run 1 forked into 3 samples, run 4 into 2
    samples = [Sample(rollout_id=r, tokens=[1, 2], response_length=1) for r in runs]
    assert update_slices(samples, cfg.trainer) == [[0, 1, 2, 3], [4, 5, 6]]
    single = [Sample(tokens=[1, 2], response_length=1) for _ in range(5)]  # single-turn: as before
    assert update_slices(single, cfg.trainer) == [[0, 1], [2, 3]]


def test_archive_keeps_the_newest_runs_and_a_row_per_task(monkeypatch, tmp_path):
    """RUN/agent/: tasks.jsonl counts each task's runs per step; the newest agent.keep_runs runs are kept, each
    with its transcript (all tokens decoded), diff and outcome; a live status is reported as runs finish."""
    from slimecli.agent.trajectory.archive import RunArchive

    cfg = config("agent.keep_runs=5")

    def with_calls(make):
        def wrapped(base):
            samples = make(base)
            for s in samples:
                s.metadata.update(tool_calls={"Bash": 2, "Read": 1}, ill_formed_turns=1, context_truncated=True)
            return samples
        return wrapped

    script = Script({(1, 0): with_calls(ok(GRADE_OK, branches=2)), (2, 0): ok(GRADE_NO),
                     (0, 0): abort("cli_missing")})
    monkeypatch.setattr(agent_rollout, "run_task", script)
    archive = RunArchive(tmp_path / "agent", cfg.agent.keep_runs, decode=lambda ids: " ".join(f"t{i}" for i in ids))
    collector = agent_rollout.AgentRollout(cfg, service=None, source=PromptSource(cfg.task, cfg.run.seed),
                                           job_factory=lambda task: task, archive=archive)
    notes: list[str] = []
    collector.on_progress = notes.append
    collector.step = 7
    result = asyncio.run(collector.collect())
    m = result.metrics
    # run 1: 3 tool calls on each of its 2 branches; 4 valid runs of 4 after run 0's retry
    assert m["agent/tool_calls/Bash"] == pytest.approx(4 / 4) and m["agent/tool_calls/Read"] == pytest.approx(2 / 4)
    assert m["agent/branches_mean"] == pytest.approx(5 / 4) and m["agent/ill_formed_turns"] == pytest.approx(2 / 4)
    assert m["agent/context_truncated_rate"] == pytest.approx(1 / 4)
    rows = [json.loads(line) for line in (tmp_path / "agent" / "tasks.jsonl").read_text().splitlines()]
    assert {r["step"] for r in rows} == {7} and sum(r["runs"] for r in rows) == 4
    assert sum(r["resolved"] for r in rows) == sum(int(s.reward["resolved"]) for s in result.samples
                                                   if s.metadata.get("branch", 0) == 0)
    kept = sorted((tmp_path / "agent" / "runs" / "step_000007").iterdir())
    assert len(kept) == 4
    forked = next(d for d in kept if d.name.endswith("-r1"))
    info = json.loads((forked / "run.json").read_text())
    assert info["reward"] == GRADE_OK and info["tool_calls"] == {"Bash": 2, "Read": 1}
    assert (forked / "transcript.txt").read_text().count("===== branch") == 2 and "t1 t2 t3 t4" in \
        (forked / "transcript.txt").read_text()
    retried = next(d for d in kept if d.name.endswith("-r0"))
    assert json.loads((retried / "run.json").read_text())["attempt_aborts"] == ["cli_missing"]
    assert notes[-1].startswith("agent runs: 4 done, 0 running, resolved ")
    # a second step: only the newest keep_runs=5 run directories survive
    collector.step = 8
    asyncio.run(collector.collect())
    survivors = list((tmp_path / "agent" / "runs").glob("step_*/*"))
    assert len(survivors) == 5 and sum(d.parent.name == "step_000008" for d in survivors) == 4


def test_time_split_per_run():
    def sample(**meta):
        return Sample(metadata=meta)

    runs = [[sample(sandbox_s=0.5, elapsed_s=4.0, engine_s=1.0, grade_s=2.0), sample(engine_s=0.5)],
            [sample(sandbox_s=1.5, elapsed_s=2.0, engine_s=1.5, grade_s=1.0)],
            [sample(abort_reason="cli_missing", sandbox_s=1.0)]]  # no CLI time, no grading
    split = agent_rollout.time_split(runs)
    assert split == pytest.approx({"agent/time/sandbox_s": 1.0, "agent/time/engine_s": 1.5,
                                   "agent/time/cli_s": 1.5, "agent/time/grade_s": 1.5})
