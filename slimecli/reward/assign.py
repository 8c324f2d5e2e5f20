"""Assign rewards: pick each sample's reward function, call it, store the raw reward on the sample.

Priority (the order THUDM/slime uses): sample.metadata["reward_path"] > the configured python
function (reward.path) > sample.metadata["rm_type"] > the configured reward (reward.name).

A reward function is user code that may raise, hang or return junk. assign_rewards never
raises for that: a failing or slow call (reward.timeout_s) sets sample.reward = None and
sample.metadata["reward_error"] = the exception type name, and its traceback goes once into
the log. Junk values are stored raw; values.py turns them into training values later.

Sync functions run in daemon threads (at most reward.concurrency at once), so a timed-out call
cannot block the loop or interpreter exit; its thread runs on until the function returns. An
async function that blocks the event loop (time.sleep inside `async def`) cannot be timed out.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slimecli.config.groups.reward import RewardConfig
from slimecli.config.import_path import load as load_reward_fn
from slimecli.reward.registry import get_reward

if TYPE_CHECKING:
    from slimecli.reward.judge import Judge
    from slimecli.reward.remote import RemoteReward

ERROR_KEY = "reward_error"
DETAIL_KEY = "reward_error_detail"

_LOGGED: set[tuple[str, ...]] = set()  # distinct errors whose traceback is already in the log


class RewardShapeError(ValueError):
    """A group reward function returned something other than one reward per sample."""


@dataclass(frozen=True)
class _Source:
    key: str  # samples with the same key (and group_index, for group rewards) are scored together
    name: str
    fn: Callable[..., Any]
    group: bool = False
    inline: bool = False  # cheap sync built-in: call it in the loop
    bounded: bool = False  # enforces its own timeouts and concurrency (remote)


async def _in_daemon_thread(fn: Callable[..., Any], arg: Any) -> Any:
    """Run a sync fn in a daemon thread: a hung reward fn can time out without blocking interpreter exit."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if future.done():
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def work() -> None:
        try:
            result: tuple[bool, Any] = (True, fn(arg))
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            result = (False, exc)
        try:
            loop.call_soon_threadsafe(settle, *result)
        except RuntimeError:  # the loop is gone (the call timed out long ago)
            pass

    threading.Thread(target=work, name="slimecli-reward", daemon=True).start()
    return await future


async def _call(source: _Source, arg: Any) -> Any:
    fn = source.fn
    if source.inline or _is_async(fn):
        result = fn(arg)
    else:
        result = await _in_daemon_thread(fn, arg)
    if inspect.isawaitable(result):
        result = await result
    return result


class _Resolver:
    """Per-call cache of reward sources (the remote client is created once per call, closed after)."""

    def __init__(self, cfg: RewardConfig):
        self.cfg = cfg
        self.remote: RemoteReward | None = None
        self.judge: Judge | None = None

    def source(self, sample: Any) -> _Source:
        metadata = sample.metadata if isinstance(sample.metadata, Mapping) else {}
        path = metadata.get("reward_path")
        if path:
            return _Source(f"path:{path}", str(path), load_reward_fn(str(path)))
        if self.cfg.path:
            return _Source(f"path:{self.cfg.path}", self.cfg.path, load_reward_fn(self.cfg.path), group=self.cfg.group)
        return self.named(str(metadata.get("rm_type") or self.cfg.name))

    def named(self, name: str) -> _Source:
        if name == "remote":
            url = self.cfg.url
            if not url:
                raise ValueError("reward=remote needs reward.url")
            if self.remote is None:
                from slimecli.reward.remote import RemoteReward

                c = self.cfg
                self.remote = RemoteReward(url, c.timeout_s, c.max_retries, c.concurrency, backoff_s=c.backoff_s)
            return _Source("remote", f"remote {self.cfg.url}", self.remote, bounded=True)
        if name == "judge":
            if self.judge is None:
                from slimecli.reward.judge import Judge

                self.judge = Judge(self.cfg)
            return _Source("judge", f"judge {self.judge.url}", self.judge, bounded=True)
        if name == "python":
            raise ValueError("reward=python needs reward.path (package.module:function or /path/file.py:function)")
        spec = get_reward(name)
        return _Source(f"name:{name}", name, spec.fn, group=spec.group, inline=spec.inline)

    async def close(self) -> None:
        if self.remote is not None:
            await self.remote.close()
        if self.judge is not None:
            await self.judge.close()


def _log_once(log: logging.Logger, name: str, exc: BaseException, timeout_s: float) -> None:
    if getattr(exc, "expected", False):  # a failure the reward reports itself (a judge's verdict): no traceback
        key0: tuple[str, ...] = (name, type(exc).__name__)
        if key0 not in _LOGGED:
            _LOGGED.add(key0)
            log.error("reward %s: %s; affected samples get metadata.%s=%r (logged once)", name, exc, ERROR_KEY,
                      type(exc).__name__)
        return
    if isinstance(exc, TimeoutError) and not str(exc):
        key: tuple[str, ...] = (name, "TimeoutError")
        if key not in _LOGGED:
            _LOGGED.add(key)
            log.error("reward %s exceeded reward.timeout_s=%ss; affected samples get metadata.%s='TimeoutError' "
                      "(logged once)", name, timeout_s, ERROR_KEY)
        return
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    key = (name, type(exc).__name__, where)
    if key in _LOGGED:
        return
    _LOGGED.add(key)
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    log.error("reward %s raised %s; affected samples get metadata.%s=%r (this traceback is logged once)\n%s",
              name, type(exc).__name__, ERROR_KEY, type(exc).__name__, text)


def _mark(samples: list[Any], exc: BaseException) -> None:
    for sample in samples:
        sample.reward = None
        sample.metadata[ERROR_KEY] = type(exc).__name__
        sample.metadata[DETAIL_KEY] = str(exc)[:500]


def _as_list(result: Any, n: int) -> list[Any]:
    if isinstance(result, (str, bytes, Mapping)) or not hasattr(result, "__len__"):
        raise RewardShapeError(f"a group reward must return a list of {n} rewards, got {type(result).__name__}")
    values = list(result)
    if len(values) != n:
        raise RewardShapeError(f"a group reward must return {n} rewards (one per sample), got {len(values)}")
    return values


async def _score(source: _Source, batch: list[Any], cfg: RewardConfig, limit: asyncio.Semaphore,
                 log: logging.Logger, failures: dict[str, int]) -> None:
    arg = list(batch) if source.group else batch[0]
    try:
        if source.bounded:
            result = await _call(source, arg)
        else:
            async with limit:
                result = await asyncio.wait_for(_call(source, arg), timeout=cfg.timeout_s)
        _assign(source, batch, result)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a user's reward function: logged, counted, marked
        _failed(source, batch, exc, cfg, log, failures)


def _score_inline(source: _Source, batch: list[Any], cfg: RewardConfig, log: logging.Logger,
                  failures: dict[str, int]) -> None:
    """A cheap synchronous built-in, scored where it stands: a task and a timeout per sample cost more than the
    function (and a timeout could not interrupt it)."""
    try:
        _assign(source, batch, source.fn(list(batch) if source.group else batch[0]))
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a user's reward function: logged, counted, marked
        _failed(source, batch, exc, cfg, log, failures)


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def _runs_inline(source: _Source) -> bool:
    return source.inline and not _is_async(source.fn)


def _assign(source: _Source, batch: list[Any], result: Any) -> None:
    values = _as_list(result, len(batch)) if source.group else [result]
    for sample, value in zip(batch, values, strict=True):
        sample.reward = value


def _failed(source: _Source, batch: list[Any], exc: BaseException, cfg: RewardConfig, log: logging.Logger,
            failures: dict[str, int]) -> None:
    _log_once(log, source.name, exc, cfg.timeout_s)
    _mark(batch, exc)
    failures[type(exc).__name__] = failures.get(type(exc).__name__, 0) + len(batch)


async def assign_rewards(samples: list[Any], cfg: RewardConfig, log: logging.Logger) -> None:
    """Set sample.reward (the raw value) on every sample; never raises for a failing reward function.

    Group rewards receive the samples of one group (same group_index) at once. Placeholders that
    already carry a reward and are removed from training (remove_sample, e.g. aborted agent runs)
    are left as they are.
    """
    resolver = _Resolver(cfg)
    failures: dict[str, int] = {}
    buckets: dict[tuple[Any, ...], tuple[_Source, list[Any]]] = {}
    try:
        for i, sample in enumerate(samples):
            metadata = getattr(sample, "metadata", None)
            if not isinstance(metadata, dict):
                sample.metadata = dict(metadata) if isinstance(metadata, Mapping) else {}
            if sample.remove_sample and sample.reward is not None:
                continue
            sample.metadata.pop(ERROR_KEY, None)
            sample.metadata.pop(DETAIL_KEY, None)
            try:
                source = resolver.source(sample)
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - the sample's reward cannot load: logged, marked
                name = str(sample.metadata.get("reward_path") or cfg.path or sample.metadata.get("rm_type") or cfg.name)
                _log_once(log, name, exc, cfg.timeout_s)
                _mark([sample], exc)
                failures[type(exc).__name__] = failures.get(type(exc).__name__, 0) + 1
                continue
            bucket = (source.key, sample.group_index) if source.group else (source.key, "sample", i)
            buckets.setdefault(bucket, (source, []))[1].append(sample)
        limit = asyncio.Semaphore(max(1, int(cfg.concurrency)))
        waiting = []
        for src, batch in buckets.values():
            if _runs_inline(src):
                _score_inline(src, batch, cfg, log, failures)
            else:
                waiting.append(_score(src, batch, cfg, limit, log, failures))
        await asyncio.gather(*waiting)
    finally:
        await resolver.close()
    if failures:
        total = sum(failures.values())
        summary = ", ".join(f"{name} x{n}" for name, n in sorted(failures.items()))
        log.warning("%d of %d samples have no reward (metadata.%s): %s", total, len(samples), ERROR_KEY, summary)
