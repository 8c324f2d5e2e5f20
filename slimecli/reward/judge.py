"""reward=judge: a served model grades each sample (LLM-as-judge).

The rubric (reward.rubric) filled with the sample's prompt, response and label goes to the judge, whose reply
must hold a verdict of the configured form (reward.verdict, verdict_regex or verdict_schema: verdict.py). Where
the judge has structured outputs, the form is sent as a constraint so that every reply parses:
- api=generate (SGLang's native /generate, slimecli's embedded engine): sampling_params.regex / json_schema;
  the prompt is rendered with the judge's chat template (its tokenizer, from /get_model_info);
- api=openai (an OpenAI-compatible /v1/chat/completions): response_format json_schema for a schema, and
  SGLang's `regex` extension for a regex (reward.judge_grammar=false for servers without it).

Requests are retried like reward=remote's (slimecli.net.client) with at most reward.concurrency in flight.
A judge that stays down raises JudgeUnavailable and a reply without a verdict VerdictUnparsed: assign_rewards
turns either into an invalid reward (reward.on_invalid), and sample.metadata["judge"] records what happened,
which reward/judge_errors counts (stats.py). Verdicts are cached by the judge's whole request (the rubric
filled with prompt, response and label, and the verdict settings), so an unchanged sample is judged once.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections import OrderedDict
from typing import Any
from urllib.parse import urlparse

import aiohttp

from slimecli.config.groups.reward import RewardConfig
from slimecli.config.port import is_auto
from slimecli.net.auth import judge_api_key
from slimecli.net.client import RetryingClient
from slimecli.net.retry import HttpStatusError, RetryPolicy, TransientError
from slimecli.reward.judge_teacher import TeacherJudge
from slimecli.reward.stats import JUDGE_KEY
from slimecli.reward.verdict import VerdictError, VerdictForm, compile_form, render, rubric_of

log = logging.getLogger(__name__)

EMBEDDED = "embedded"


class JudgeError(RuntimeError):
    """The judge gave no verdict; `kind` is what reward/judge_errors/<kind> counts."""

    kind = "error"
    expected = True  # assign_rewards logs its message once, without a traceback


class JudgeUnavailable(JudgeError):
    kind = "unavailable"


class VerdictUnparsed(JudgeError):
    kind = "unparsed"


def judge_url(cfg: RewardConfig) -> str:
    """Where the judge answers: reward.judge_url, or the embedded judge's address."""
    if cfg.judge_url == EMBEDDED:
        if is_auto(cfg.judge_port):
            raise JudgeUnavailable("reward.judge_url=embedded: no port was picked for the judge (it is started, "
                                   "and its port chosen, by `slimecli train` and `slimecli eval`)")
        return f"http://{cfg.judge_host}:{cfg.judge_port}"
    if not cfg.judge_url:
        raise JudgeUnavailable("reward=judge needs reward.judge_url")
    return cfg.judge_url.rstrip("/")


def judge_api(cfg: RewardConfig) -> str:
    """generate, openai or teacher: reward.judge_api, or (auto) openai when the URL's path has a /v1 segment."""
    if cfg.judge_api != "auto":
        return cfg.judge_api
    if cfg.judge_url == EMBEDDED:
        return "generate"
    return "openai" if "v1" in urlparse(str(cfg.judge_url)).path.split("/") else "generate"


class VerdictCache:
    """Verdicts by request key, the most recently used kept (one per process: it outlives a step's clients)."""

    def __init__(self) -> None:
        self._items: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def get(self, key: str) -> tuple[str, float] | None:
        item = self._items.get(key)
        if item is not None:
            self._items.move_to_end(key)
        return item

    def put(self, key: str, item: tuple[str, float], size: int) -> None:
        if size <= 0:
            return
        self._items[key] = item
        self._items.move_to_end(key)
        while len(self._items) > size:
            self._items.popitem(last=False)

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


CACHE = VerdictCache()


class Judge(RetryingClient):
    """Callable per-sample reward backed by one aiohttp session; use as `async with` or close()."""

    error = JudgeUnavailable

    def __init__(self, cfg: RewardConfig, form: VerdictForm | None = None, cache: VerdictCache = CACHE) -> None:
        super().__init__(RetryPolicy(max_retries=cfg.max_retries, backoff_s=cfg.backoff_s), cfg.timeout_s,
                         cfg.concurrency)
        self.cfg = cfg
        self.form = form or compile_form(cfg)
        try:
            self.url, self.unreachable = judge_url(cfg), None
        except JudgeUnavailable as exc:  # reported per sample, counted like a judge that is down
            self.url, self.unreachable = str(cfg.judge_url), exc
        self.api = judge_api(cfg)
        self.rubric = rubric_of(cfg)
        self.cache = cache
        self.api_key = judge_api_key(cfg.judge_api_key)
        self._template: Any = None  # generate: the chat template's tokenizer, False for raw text
        self._template_lock = asyncio.Lock()
        self._pending: dict[str, asyncio.Future[str]] = {}  # requests in flight by key: twins wait for the first
        self._teacher = TeacherJudge(self.url, self.form, self._post, self._get)  # api=teacher: judge_teacher.py

    async def __call__(self, sample: Any) -> float:
        record: dict[str, Any] = {}
        sample.metadata[JUDGE_KEY] = record  # {verdict, cached} or {error: kind, detail}
        if self.unreachable is not None:
            record.update(error=JudgeUnavailable.kind, detail=str(self.unreachable))
            raise JudgeUnavailable(str(self.unreachable))
        text = render(self.rubric, self.form, sample.prompt, sample.response, sample.label)
        key = self._key(text)
        caching = self.cfg.judge_cache_size > 0
        hit = self.cache.get(key) if caching else None
        if hit is not None:
            record.update(verdict=hit[0], cached=True)
            return hit[1]
        shared = self._pending.get(key) if caching else None  # the same request in flight (a group's twins)
        try:
            if shared is not None:
                reply = await asyncio.shield(shared)
            else:
                task = asyncio.ensure_future(self.call(lambda: self._ask(text), f"judge {self.url}"))
                self._pending[key] = task
                try:
                    reply = await task
                finally:
                    self._pending.pop(key, None)
        except JudgeUnavailable as exc:
            record.update(error=JudgeUnavailable.kind, detail=str(exc)[:300])
            raise JudgeUnavailable(str(exc)) from None
        record.update(verdict=reply[:2000], cached=shared is not None)
        try:
            value = self.form.parse(reply)
        except VerdictError as exc:
            record.update(error=VerdictUnparsed.kind, detail=str(exc)[:300])
            raise VerdictUnparsed(f"judge {self.url}: {exc}") from None
        self.cache.put(key, (reply, value), self.cfg.judge_cache_size)
        return value

    def _key(self, text: str) -> str:
        c = self.cfg
        what = [self.url, self.api, c.judge_model, text, self.form.constraint, self.form.verdict, c.score_max,
                c.judge_grammar, c.judge_max_tokens, c.judge_temperature]
        return hashlib.sha256(json.dumps(what, default=str).encode()).hexdigest()

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    async def _get(self, url: str) -> Any:
        try:
            async with self.session.get(url, headers=self._headers()) as resp:
                if resp.status != 200:
                    raise HttpStatusError(resp.status, (await resp.text(errors="replace"))[:200])
                return await resp.json(content_type=None)
        except (aiohttp.ClientError, ValueError) as exc:
            raise TransientError(f"GET {url}: {exc}") from None

    async def _post(self, url: str, body: dict[str, Any]) -> Any:
        return await self.post_json(url, json.dumps(body).encode(), self._headers(),
                                    f"reward.timeout_s={self.timeout_s}s")

    async def _ask(self, text: str) -> str:
        """One request: the judge's reply text."""
        if self.api == "openai":
            return await self._ask_openai(text)
        if self.api == "teacher":
            return await self._teacher.verdict(text)
        prompt = await self._chat(text)
        params: dict[str, Any] = {"max_new_tokens": self.cfg.judge_max_tokens, "temperature": self.cfg.judge_temperature}
        if self.cfg.judge_grammar:
            kind, constraint = self.form.constraint
            params[kind] = constraint
        reply = await self._post(f"{self.url}/generate", {"text": prompt, "sampling_params": params})
        if isinstance(reply, list) and len(reply) == 1:
            reply = reply[0]
        if not isinstance(reply, dict) or not isinstance(reply.get("text"), str):
            raise TransientError(f"reply has no text: {str(reply)[:80]!r}")
        return reply["text"]

    async def _ask_openai(self, text: str) -> str:
        c = self.cfg
        url = self.url if self.url.endswith("/chat/completions") else f"{self.url}/chat/completions"
        body: dict[str, Any] = {"model": c.judge_model or "default", "messages": [{"role": "user", "content": text}],
                                "max_tokens": c.judge_max_tokens, "temperature": c.judge_temperature}
        if c.judge_grammar:
            kind, constraint = self.form.constraint
            if kind == "regex":
                body["regex"] = constraint  # SGLang's extension of the OpenAI API
            else:
                body["response_format"] = {"type": "json_schema",
                                           "json_schema": {"name": "verdict", "schema": json.loads(constraint)}}
        reply = await self._post(url, body)
        try:
            content = reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise TransientError(f"reply has no choices[0].message.content: {str(reply)[:80]!r}") from None
        if not isinstance(content, str):
            raise TransientError("reply's message content is not text")
        return content

    async def _chat(self, text: str) -> str:
        """The prompt as the judge's chat template renders one user message (raw text without a template)."""
        async with self._template_lock:
            if self._template is None:
                self._template = await self._load_template()
        tok = self._template
        if tok is False:
            return text
        rendered = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False)
        return str(rendered)

    async def _load_template(self) -> Any:
        try:
            async with self.session.get(f"{self.url}/get_model_info", headers=self._headers()) as resp:
                info = await resp.json(content_type=None) if resp.status == 200 else {}
        except (aiohttp.ClientError, OSError, ValueError, TimeoutError) as exc:
            raise TransientError(f"cannot read the judge's /get_model_info: {exc}") from None
        path = info.get("tokenizer_path") if isinstance(info, dict) else None
        if not path:
            log.warning("judge %s names no tokenizer_path in /get_model_info: its prompts go without a chat "
                        "template", self.url)
            return False
        try:
            from slimecli.model.loading import load_tokenizer

            tok = await asyncio.to_thread(load_tokenizer, path)
        except (OSError, ValueError, ImportError) as exc:
            log.warning("judge %s: cannot load its tokenizer %s (%s): its prompts go without a chat template",
                        self.url, path, exc)
            return False
        return tok if getattr(tok, "chat_template", None) else False
