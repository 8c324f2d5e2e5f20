"""The scheduler thread: admits waiting sequences, runs decode steps over all running ones, finishes them.

Everything that touches the model or the batch runs on this one thread; the HTTP side talks to it through
a command queue (`call`) and gets updates back on its event loop. A failing step aborts the sequences of
that step and the loop carries on: the server never dies with a request.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import os
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch

from slimecli.engine.grammar import Matcher, allowed_tokens, forced_run, forced_token, prime
from slimecli.engine.prefix_cache import PrefixCache
from slimecli.engine.runner import Runner
from slimecli.engine.sampling import NEG_INF, sample
from slimecli.engine.seq import FinishReason, Seq
from slimecli.engine.settings import EngineSettings
from slimecli.process import AWAIT_WEIGHTS_ENV

if TYPE_CHECKING:
    from slimecli.engine.bodies import PauseMode

log = logging.getLogger("slimecli.engine")
JUMP_MIN = 8  # grammar-forced tokens a jump-forward must skip at the least (see Scheduler._append_forced)
JUMP_PER_ROW = 4
Update = tuple[Seq, int, "FinishReason | None"]  # a sequence, its token count and finish reason at that moment
T = TypeVar("T")  # what a command run on the scheduler thread returns


class Scheduler:
    def __init__(self, model: Any, tokenizer: Any, *, max_running: int = EngineSettings.max_running, pad_id: int = 0,
                 max_prefill_tokens: int = 8192, seed: int | None = None, prefix_cache_bytes: int = 1 << 30,
                 prefix_cache_min_tokens: int = 256, jump_forward: bool = True,
                 dispatch: Callable[[list[Update]], None] | None = None) -> None:
        self.prefix = PrefixCache(prefix_cache_bytes, prefix_cache_min_tokens)
        self.runner = Runner(model, pad_id=pad_id, max_prefill_tokens=max_prefill_tokens, prefix_cache=self.prefix)
        self.tokenizer = tokenizer
        self.max_running = max_running
        self.jump_forward = jump_forward  # append grammar-forced tokens without decode steps
        self.dispatch = dispatch or (lambda seqs: None)
        self.weight_version = "default"
        # restarted by the supervisor mid-run: no generation until the trainer's weights (any update) arrive
        self.awaiting_weights = os.environ.get(AWAIT_WEIGHTS_ENV) == "1"
        self.paused = False
        self.generator = torch.Generator(device=self.runner.device)
        if seed is not None:
            self.generator.manual_seed(seed)
        else:
            self.generator.seed()
        self.waiting: collections.deque[Seq] = collections.deque()
        self._commands: collections.deque[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = (
            collections.deque())
        self._wake = threading.Condition(threading.RLock())
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="slimecli-engine-scheduler", daemon=True)
        self.stats: dict[str, float] = {
            "steps": 0, "prefills": 0, "generated_tokens": 0, "prefill_tokens": 0, "finished_requests": 0,
            "aborted_requests": 0, "step_errors": 0, "max_batch": 0, "prefill_s": 0.0, "decode_s": 0.0,
            "sample_s": 0.0, "grammar_s": 0.0,
            "forced_tokens": 0, "extends": 0, "extend_s": 0.0}

    # ---- called from other threads --------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop

    def stop(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify_all()
        self._thread.join(timeout=10)

    def submit(self, seqs: list[Seq]) -> None:
        with self._wake:
            self.waiting.extend(seqs)
            self._wake.notify_all()

    def call(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run fn on the scheduler thread between two steps."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._wake:
            self._commands.append((fn, fut))
            self._wake.notify_all()
        return fut

    @property
    def running(self) -> list[Seq]:
        return self.runner.rows

    def load(self) -> dict[str, int]:
        return {"running": len(self.runner.rows), "waiting": len(self.waiting),
                "prefix_cache_entries": len(self.prefix.entries), "prefix_cache_bytes": self.prefix.nbytes,
                "prefix_cache_hits": self.prefix.hits, "prefix_cache_hit_tokens": self.prefix.hit_tokens}

    # ---- commands (run on the scheduler thread via call) ----------------------------------
    def abort(self, match: Callable[[Seq], bool], message: str = "Aborted by request.") -> int:
        hit = [s for s in self.runner.rows if match(s)]
        for s in hit:
            s.abort(message)
        with self._wake:  # the event loop appends to `waiting` under this lock
            waiting_hit = [s for s in self.waiting if match(s)]
            for s in waiting_hit:
                s.abort(message)
                self.waiting.remove(s)
        self._retire()
        self._emit(waiting_hit)
        return len(hit) + len(waiting_hit)

    def pause(self, mode: PauseMode) -> int:
        """abort: finish everything with type abort; retract: requeue running rows (they resume from their
        tokens so far); in_place: keep them and their cache as they are."""
        self.paused = True
        if mode == "abort":
            return self.abort(lambda s: True, "Aborted: generation paused.")
        if mode == "retract":
            rows = list(self.runner.rows)
            self.runner.save(list(range(len(rows))))  # resuming them re-uses their keys/values
            for s in rows:
                s.retractions += 1
            self.runner.clear()
            with self._wake:
                self.waiting.extendleft(reversed(rows))
            return len(rows)
        return len(self.runner.rows)

    def resume(self) -> None:
        self.paused = False

    def flush(self) -> bool:
        if self.runner.rows or self.waiting:
            return False
        self.runner.clear()
        self.prefix.clear()
        return True

    def swap_model(self, model: Any, version: str | None) -> None:
        self.runner.set_model(model)  # same device as before: load_compatible loads it there
        self._new_version(version)

    def load_weights(self, copy: Callable[[Any], None], version: str | None) -> None:
        self.runner.load_weights(copy)
        self._new_version(version)

    def _new_version(self, version: str | None) -> None:
        """Sequences that live through the update note where it fell (meta_info.weight_versions)."""
        with self._wake:
            living = [*self.runner.rows, *self.waiting]
        for s in living:
            s.version_events.append((self.weight_version, len(s.output_ids)))
        if version is not None:
            self.weight_version = version
        self.awaiting_weights = False

    # ---- the loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stop and not self._commands and (self.paused or not (self.waiting or self.running)):
                    self._wake.wait(timeout=0.5)
                if self._stop:
                    break
                commands = list(self._commands)
                self._commands.clear()
            for fn, fut in commands:
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn())
                    except BaseException as exc:  # noqa: BLE001 - handed to the caller
                        fut.set_exception(exc)
            if self.paused:
                continue
            try:
                self._admit()
                if self.running:
                    self._step()
            except Exception as exc:  # noqa: BLE001 - the engine must outlive any one batch
                self.stats["step_errors"] += 1
                log.error("engine step failed, aborting its requests: %s\n%s", exc, traceback.format_exc())
                victims = list(self.runner.rows)
                self.runner.clear()
                for s in victims:
                    s.abort(f"engine error: {type(exc).__name__}: {exc}")
                self._emit(victims)

    def _admit(self) -> None:
        room = self.max_running - len(self.runner.rows)
        if room <= 0 or not self.waiting:
            return
        with self._wake:
            new = [self.waiting.popleft() for _ in range(min(room, len(self.waiting)))]
        for s in new:
            if s.params.max_new_tokens == 0 and not s.done:  # prefill-only: at most score the prompt
                try:
                    self.runner.score(s)
                except Exception as exc:  # noqa: BLE001 - e.g. a prompt too long for memory: fail it alone
                    log.error("scoring prefill failed: %s", exc)
                    s.abort(f"prefill failed: {type(exc).__name__}: {exc}")
                if not s.done:
                    s.finish = {"type": "length", "length": 0}
        finished = [s for s in new if s.done]
        ready = [s for s in new if not s.done]
        for group in self.runner.groups(ready):
            t0 = time.perf_counter()
            try:
                logits = self.runner.prefill(group)
            except Exception as exc:  # noqa: BLE001 - e.g. a prompt too long for memory: fail it, not the batch
                log.error("prefill failed: %s", exc)
                for s in group:
                    s.abort(f"prefill failed: {type(exc).__name__}: {exc}")
                self._emit(group)
                continue
            self.stats["prefill_tokens"] += sum(len(s.context()) for s in group)
            self.stats["prefills"] += 1
            self.stats["prefill_s"] += time.perf_counter() - t0
            self._catch_up(self._sample(group, logits))
        self._emit(finished)

    def _step(self) -> None:
        t0 = time.perf_counter()
        logits = self.runner.decode()
        self.stats["steps"] += 1
        self.stats["max_batch"] = max(self.stats["max_batch"], len(self.runner.rows))
        self.stats["decode_s"] += time.perf_counter() - t0
        self._catch_up(self._sample(self.runner.rows, logits))

    def _catch_up(self, jumped: list[Seq]) -> None:
        """Retire finished rows; rows that jumped over forced tokens run them in one forward and sample the
        next token (which may jump again) until every running row is one token ahead of its cache."""
        self._retire()
        while live := [s for s in jumped if not s.done]:
            t0 = time.perf_counter()
            logits = self.runner.extend(live)
            self.stats["extends"] += 1
            self.stats["extend_s"] += time.perf_counter() - t0
            jumped = self._sample(live, logits)
            self._retire()

    def _decode_tail(self, ids: list[int]) -> str:
        text: str = self.tokenizer.decode(ids, skip_special_tokens=False)
        return text

    def _masks(self, rows: list[Seq], vocab: int) -> tuple[list[int], torch.Tensor] | None:
        """Next-token masks of the grammar-constrained rows, from each one's matcher state."""
        which = [i for i, s in enumerate(rows) if s.grammar is not None and not s.done]
        if not which:
            return None
        t0 = time.perf_counter()
        matchers = cast(list[Matcher], [rows[i].grammar for i in which])  # `which` has only rows with one
        masks = allowed_tokens(matchers, vocab, self.runner.device)
        self.stats["grammar_s"] += time.perf_counter() - t0
        return which, masks

    def _sample(self, rows: list[Seq], logits: torch.Tensor) -> list[Seq]:
        """Sample a token for every row; returns the rows that then jumped over grammar-forced tokens."""
        t0 = time.perf_counter()
        allowed = self._masks(rows, logits.shape[-1])
        draw = sample(logits, [s.row(self.runner.device) for s in rows], self.generator, allowed)
        appended = []
        for s, tok, lp, top, ids in zip(rows, draw.tokens, draw.logprobs, draw.top, draw.ids, strict=True):
            if s.done:  # aborted while the step ran
                continue
            s.append(tok, lp, top, self._decode_tail, ids)
            appended.append(s)
        jumped = self._jump(appended) if self.jump_forward else []
        streamed = [s for s in appended if s.stream and not s.done]
        self.stats["generated_tokens"] += len(rows)
        self.stats["sample_s"] += time.perf_counter() - t0
        self._emit(streamed)
        return jumped

    def _jump(self, rows: list[Seq]) -> list[Seq]:
        """The constrained rows that jumped over grammar-forced tokens. Their next masks are computed here, for all
        of them at once: the check reads them, and so does the next step's draw of the rows that did not jump."""
        constrained = [s for s in rows if s.grammar is not None and not s.done]
        if not constrained:
            return []
        t0 = time.perf_counter()
        prime(cast(list[Matcher], [s.grammar for s in constrained]))
        self.stats["grammar_s"] += time.perf_counter() - t0
        return [s for s in constrained if self._append_forced(s)]

    def _append_forced(self, s: Seq) -> int:
        """Append the tokens the grammar forces next, as the sampler would have drawn them: each with
        log-prob 0, its only candidate (top log-probs) and -inf for every other id asked for.

        Only a run worth the jump: the jump takes the row out of the batch and back (copies of the batch's
        cache) and gives it a forward of its own, while a short run rides along the batch's decode steps for a
        share of each; so a run must be JUMP_MIN tokens long, and JUMP_PER_ROW per running row."""
        assert s.grammar is not None
        t0 = time.perf_counter()
        need = max(JUMP_MIN, JUMP_PER_ROW * len(self.runner.rows))
        run = forced_run(s.grammar, need)
        if len(run) < need:
            self.stats["grammar_s"] += time.perf_counter() - t0
            return 0
        n = 0
        while not s.done and (tok := run.pop(0) if run else forced_token(s.grammar)) is not None:
            row = s.row(self.runner.device)
            top = [(0.0, tok)] if row.top_n else None
            ids = [(0.0 if t == tok else NEG_INF, t) for t in row.ids_logprob] if row.ids_logprob else None
            s.append(tok, 0.0, top, self._decode_tail, ids)
            n += 1
        self.stats["forced_tokens"] += n
        self.stats["generated_tokens"] += n
        self.stats["grammar_s"] += time.perf_counter() - t0
        return n

    def _retire(self) -> None:
        rows = self.runner.rows
        keep = [not s.done for s in rows]
        if all(keep):
            return
        gone = [s for s, k in zip(rows, keep, strict=True) if not k]
        self.runner.remove(keep)
        self._emit(gone)

    def _emit(self, seqs: list[Seq]) -> None:
        if not seqs:
            return
        for s in seqs:
            if s.done:
                s.weight_version = self.weight_version
                self.stats["finished_requests"] += 1
                if s.finish and s.finish["type"] == "abort":
                    self.stats["aborted_requests"] += 1
        self.dispatch([(s, len(s.output_ids), s.finish) for s in seqs])

    def wait_idle(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running and not self.waiting:
                return True
            time.sleep(0.01)
        return False
