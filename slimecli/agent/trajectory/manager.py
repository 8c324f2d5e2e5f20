"""Per-session token trajectories: turns recorded by the adapters become training samples.

Each session keeps a set of branches (the leaves of its message tree). A turn whose prompt extends a branch
cleanly is appended to it (new context tokens loss_mask 0, sampled tokens 1); a prompt that re-renders the
branch's last response slightly differently (re-serialised tool arguments, BPE merges) is realigned onto the
sampled tokens; any other prompt forks a new branch whose prompt is the whole rendered context, so a response
shared by several branches is trained exactly once (in the branch that sampled it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from slimecli.rollout.sample import Sample, Status, version_number


class SessionClosed(Exception):
    """The session was finished or dropped: the adapter answers 503."""


class TooManyTurns(Exception):
    """The session used up agent.max_turns: the adapter answers 429."""


@dataclass
class Turn:
    prompt_ids: list[int]
    output_ids: list[int]
    output_log_probs: list[float]
    finish_reason: str  # SGLang finish type: stop | length | abort
    ill_formed: bool = False
    weight_version: str | None = None
    tool_calls: tuple[str, ...] = ()  # names of the tools the turn called
    context_limited: bool = False  # the context window, not the client, bounded the turn
    engine_s: float = 0.0  # the turn's time in the engine
    constrained: bool = False  # sampled under a grammar: its log-probs are of the masked distribution
    token_versions: list[int] | None = None  # the weight version that sampled each output token (partial rollouts)

    def trained(self) -> list[int]:
        """Loss mask of the output: under a grammar, a token it forced (masked log-prob exactly 0, the only
        allowed token) was no choice of the policy, so it is context, not a decision to reinforce."""
        if not self.constrained:
            return [1] * len(self.output_ids)
        return [0 if lp == 0.0 else 1 for lp in self.output_log_probs]


@dataclass
class _Branch:
    tokens: list[int]
    prompt_len: int
    loss_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    last_context_len: int = 0  # len(tokens) before the last sampled output
    last_output: list[int] = field(default_factory=list)
    finish_reason: str = "stop"
    turns: int = 0
    ill_formed: int = 0
    realigned: int = 0
    weight_versions: list[str] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # per token after the prompt: the weights that sampled it
    tool_calls: dict[str, int] = field(default_factory=dict)
    context_limited: bool = False
    engine_s: float = 0.0

    def extend_context(self, ids: list[int]) -> None:
        self.tokens.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.log_probs.extend([0.0] * len(ids))
        self.versions.extend([-1] * len(ids))

    def add_turn(self, turn: Turn) -> None:
        self.last_context_len = len(self.tokens)
        self.last_output = list(turn.output_ids)
        self.tokens.extend(turn.output_ids)
        self.loss_mask.extend(turn.trained())
        self.log_probs.extend(float(x) for x in turn.output_log_probs)
        n = len(turn.output_ids)
        versions = turn.token_versions if turn.token_versions and len(turn.token_versions) == n else None
        self.versions.extend(versions or [version_number(turn.weight_version)] * n)
        self.finish_reason = turn.finish_reason
        self.turns += 1
        self.ill_formed += int(turn.ill_formed)
        for name in turn.tool_calls:
            self.tool_calls[name] = self.tool_calls.get(name, 0) + 1
        self.context_limited = self.context_limited or turn.context_limited
        self.engine_s += turn.engine_s
        if turn.weight_version is not None:
            self.weight_versions.append(turn.weight_version)


@dataclass
class _Session:
    branches: list[_Branch] = field(default_factory=list)
    turns: int = 0
    in_flight: int = 0


class TrajectoryManager:
    def __init__(self, stop_ids: Iterable[int], decode: Callable[[list[int]], str], max_turns: int = 64,
                 realign_min_ratio: float = 0.8) -> None:
        self.stop_ids = set(stop_ids)
        self.decode = decode
        self.max_turns = max_turns
        self.realign_min_ratio = realign_min_ratio
        self._sessions: dict[str, _Session] = {}
        self._closed: set[str] = set()
        # Called with (session id, turn) for every recorded turn: `slimecli agent run` shows each as it ends.
        self.on_turn: Callable[[str, Turn], None] | None = None

    # --- adapter side -------------------------------------------------------------------------------
    def begin_turn(self, sid: str) -> None:
        """Admit one request of session `sid` (created on first use)."""
        if sid in self._closed:
            raise SessionClosed(sid)
        session = self._sessions.setdefault(sid, _Session())
        if session.turns >= self.max_turns:
            raise TooManyTurns(sid)
        session.turns += 1
        session.in_flight += 1

    def end_turn(self, sid: str, turn: Turn | None) -> None:
        """Close an admitted request; `turn` is recorded only when its reply reached the client."""
        session = self._sessions.get(sid)
        if session is None:  # dropped meanwhile
            return
        session.in_flight = max(0, session.in_flight - 1)
        if turn is not None and sid not in self._closed:
            self._record(session, turn)
            if self.on_turn is not None:
                self.on_turn(sid, turn)

    def is_closed(self, sid: str) -> bool:
        return sid in self._closed

    def sessions(self) -> list[str]:
        return list(self._sessions)

    # --- harness side -------------------------------------------------------------------------------
    async def finish_session(self, sid: str, base_sample: Sample, reward: Any, drain_timeout_s: float = 30.0
                             ) -> list[Sample]:
        """Close the session, wait for its in-flight turns, return its samples; a second call returns []."""
        if sid in self._closed:
            return []
        self._closed.add(sid)
        session = self._sessions.get(sid)
        if session is None:
            return []
        deadline = time.monotonic() + drain_timeout_s
        while session.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self._sessions.pop(sid, None)
        rollout_id = base_sample.rollout_id if base_sample.rollout_id is not None else uuid.uuid4().int % (1 << 31)
        branches = [b for b in session.branches if len(b.tokens) > b.prompt_len]
        return [self._to_sample(b, i, len(branches), sid, base_sample, reward, rollout_id)
                for i, b in enumerate(branches)]

    def drop_session(self, sid: str) -> None:
        """Forget the session's data and refuse its later requests; safe to call any number of times."""
        self._closed.add(sid)
        self._sessions.pop(sid, None)

    # --- internals ----------------------------------------------------------------------------------
    def _record(self, session: _Session, turn: Turn) -> None:
        prompt = turn.prompt_ids
        realign: tuple[_Branch, int] | None = None
        for branch in sorted(session.branches, key=lambda b: -len(b.tokens)):
            n = len(branch.tokens)
            if prompt[:n] == branch.tokens:
                branch.extend_context(prompt[n:])
                branch.add_turn(turn)
                return
            if realign is None:
                rest = self._realign_point(branch, prompt)
                if rest is not None:
                    realign = (branch, rest)
        if realign is not None:
            branch, rest = realign
            branch.extend_context(prompt[rest:])
            branch.realigned += 1
            branch.add_turn(turn)
            return
        branch = _Branch(tokens=list(prompt), prompt_len=len(prompt))
        branch.add_turn(turn)
        session.branches.append(branch)

    def _realign_point(self, branch: _Branch, prompt: list[int]) -> int | None:
        """Where the new prompt continues after re-rendering the branch's last output, if that drift is small."""
        start = branch.last_context_len
        if branch.turns == 0 or prompt[:start] != branch.tokens[:start]:
            return None
        end = next((i for i in range(start, len(prompt)) if prompt[i] in self.stop_ids), None)
        if end is None:
            return None
        old = branch.last_output
        closed = bool(old) and old[-1] in self.stop_ids
        if closed:
            old = old[:-1]
        ratio = difflib.SequenceMatcher(None, self.decode(old), self.decode(prompt[start:end]), autojunk=False).ratio()
        if ratio < self.realign_min_ratio:
            return None
        return end + 1 if closed else end

    def _to_sample(self, b: _Branch, i: int, n: int, sid: str, base: Sample, reward: Any, rollout_id: int) -> Sample:
        response_ids = b.tokens[b.prompt_len:]
        status = Status.from_finish_reason(b.finish_reason)
        metadata = {**base.metadata, "turns": b.turns, "ill_formed_turns": b.ill_formed, "realigned": b.realigned,
                    "branch": i, "num_branches": n, "tool_calls": dict(b.tool_calls),
                    "context_truncated": b.context_limited, "engine_s": round(b.engine_s, 4)}
        return dataclasses.replace(
            base, session_id=sid, rollout_id=rollout_id, tokens=list(b.tokens), response=self.decode(response_ids),
            response_length=len(response_ids), loss_mask=list(b.loss_mask), rollout_log_probs=list(b.log_probs),
            reward=reward, status=status, weight_versions=list(b.weight_versions), remove_sample=False,
            token_versions=list(b.versions[-len(response_ids):]) if response_ids else [],
            metadata=metadata)
