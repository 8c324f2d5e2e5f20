"""What the embedded engine does with every /generate field SGLang accepts.

Read from sglang 0.5.23: srt/sampling/sampling_params.py (SamplingParams: __post_init__, verify, normalize),
api/v1/api_types.py (the /generate JSON contract: unknown sampling_params keys are a 400, unknown top-level
keys are dropped), srt/managers/io_struct.py (GenerateReqInput) and tokenizer_manager.py (request checks).

sampling_params
  implemented  max_new_tokens temperature top_p top_k min_p stop stop_token_ids stop_regex min_new_tokens
               ignore_eos skip_special_tokens spaces_between_special_tokens no_stop_trim n repetition_penalty
               frequency_penalty presence_penalty sampling_seed regex json_schema ebnf logit_bias
               stream_interval
  ignored      custom_params   any JSON value: SGLang reads it only in a custom logit processor, which a
                               server without --enable-custom-logit-processor refuses (so does this engine:
                               top-level custom_logit_processor is a 400); its reserved
                               "__sglang_reasoning_end_token_ids" key is still checked as SGLang checks it
               watermark       null or {"enabled": false}: a default SGLang server (no --enable-watermark)
                               ignores those and refuses an enabled watermark with a 400, as this engine does
               beam_width      null or 1: SGLang's "not a beam request"
               structural_tag  null or "": SGLang's "unset"
  refused      beam_width > 1 (beam search) and a non-empty structural_tag: 400 naming the field. `choice`
               is in the contract but not in the Python server's SamplingParams, which refuses it: 400 too.

Top-level fields: IGNORED_KEYS take any value (routing, metrics, prefix-cache namespaces, disaggregation:
nothing that changes one engine's reply); INERT_KEYS are features this engine lacks (multimodal, LoRA,
sessions, hidden states, ...), accepted while unset; anything else is a 400 (SGLang would drop it silently).
"""

from __future__ import annotations

import re
import re._parser as sre_parse  # the regex parser (sre_parse before Python 3.11)
from typing import Any, TypedDict

from slimecli.config.decode import is_int

MAX_STOP = 32  # SGLang's MAX_STOP_COUNT / MAX_STOP_REGEX_COUNT
MAX_STOP_REGEX_BYTES = 256
REASONING_END_KEY = "__sglang_reasoning_end_token_ids"
MAX_BIAS = 1e30  # |logit_bias|: divided by a temperature >= 1e-5 it stays finite in float32

COMPAT_SAMPLING_KEYS = {"stop_regex", "logit_bias", "stream_interval", "custom_params", "watermark", "beam_width",
                        "structural_tag"}
EXTRA_GENERATE_KEYS = {"token_ids_logprob", "return_prompt_token_ids", "watermark"}
IGNORED_KEYS = {"log_metrics", "no_logs", "priority", "extra_key", "cache_salt", "routing_key", "conversation_id",
                "custom_labels", "received_time", "external_trace_header", "http_worker_ipc", "routed_dp_rank",
                "data_parallel_rank", "disagg_prefill_dp_rank", "bootstrap_host", "bootstrap_port",
                "bootstrap_room", "bootstrap_pair_key", "decode_tp_size", "kv_hints", "background"}
INERT_KEYS = {"image_data", "audio_data", "video_data", "input_embeds", "mm_hashes", "mm_content_hashes",
              "use_audio_in_video", "video_config", "modalities", "lora_path", "lora_id", "session_params",
              "session_id", "custom_logit_processor", "return_hidden_states", "return_routed_experts",
              "routed_experts_start_len", "return_indexer_topk", "positional_embed_overrides",
              "return_sampling_mask", "sampling_logprobs_mode", "return_flat_raw_top_logprobs",
              "return_flat_raw_output_top_logprobs", "require_reasoning", "max_thinking_tokens", "return_bytes",
              "return_entropy", "need_wait_for_mm_inputs", "num_items_assigned", "encoder_urls",
              "max_dynamic_patch", "min_dynamic_patch", "image_max_dynamic_patch", "video_max_dynamic_patch",
              "images_config", "mm_processor_kwargs", "multi_item_delimiter_indices", "token_indices_to_pool"}


class CompatError(ValueError):
    """A field SGLang would refuse (protocol.py turns it into its BadRequest)."""


def _regex_window(pattern: str) -> int:
    """Characters a match can span (0 = unbounded): how much decoded tail the stop check must look at."""
    try:
        hi = sre_parse.parse(pattern).getwidth()[1]
    except (re.error, RecursionError, OverflowError):
        return 0
    return 0 if hi >= sre_parse.MAXREPEAT else int(hi)


def sampling_extras(where: str, raw: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """SamplingParams keyword arguments for the fields this module owns (raises CompatError)."""
    kw: dict[str, Any] = {}
    if (sr := raw.get("stop_regex")) is not None:
        pats = [sr] if isinstance(sr, str) else sr
        if not isinstance(pats, list) or not all(isinstance(p, str) for p in pats):
            raise CompatError(f"{where}.stop_regex: must be a string or a list of strings")
        if len(pats) > MAX_STOP:
            raise CompatError(f"{where}.stop_regex: at most {MAX_STOP} patterns (got {len(pats)})")
        windows = []
        for p in pats:
            if not p:
                raise CompatError(f"{where}.stop_regex: patterns must not be empty")
            if len(p.encode()) > MAX_STOP_REGEX_BYTES:
                raise CompatError(f"{where}.stop_regex: a pattern is over {MAX_STOP_REGEX_BYTES} bytes")
            try:
                re.compile(p)
            except (re.error, RecursionError, OverflowError) as exc:
                raise CompatError(f"{where}.stop_regex: invalid regex {p!r}: {exc}") from None
            windows.append(_regex_window(p))
        kw["stop_regex"] = tuple(pats)
        kw["stop_regex_window"] = 0 if 0 in windows or not windows else max(windows)
    if (bias := raw.get("logit_bias")) is not None:
        kw["logit_bias"] = _logit_bias(f"{where}.logit_bias", bias, vocab_size)
    if (si := raw.get("stream_interval")) is not None:
        if not is_int(si) or si < 0:
            raise CompatError(f"{where}.stream_interval: must be an integer >= 0 (got {si!r})")
        kw["stream_interval"] = si or None
    check_custom_params(f"{where}.custom_params", raw.get("custom_params"), vocab_size)
    check_watermark(f"{where}.watermark", raw.get("watermark"))
    bw = raw.get("beam_width")
    if bw is not None:
        if not is_int(bw) or bw < 1:
            raise CompatError(f"{where}.beam_width: must be an integer >= 1 (got {bw!r})")
        if bw > 1:
            raise CompatError(f"{where}.beam_width: beam search is not supported by the embedded engine "
                              "(use n for parallel samples, or rollout=sglang)")
    tag = raw.get("structural_tag")
    if tag is not None and tag != "":
        if not isinstance(tag, str):
            raise CompatError(f"{where}.structural_tag: must be a string (got {type(tag).__name__})")
        raise CompatError(f"{where}.structural_tag: not supported by the embedded engine (use regex, json_schema "
                          "or ebnf, or rollout=sglang)")
    return kw


def _logit_bias(where: str, bias: object, vocab_size: int) -> tuple[tuple[int, float], ...]:
    if not isinstance(bias, dict):
        raise CompatError(f"{where}: must be an object of token id -> bias")
    out: dict[int, float] = {}
    for k, v in bias.items():
        try:
            tid = int(k)
        except (TypeError, ValueError):
            raise CompatError(f"{where}: key {k!r} is not a token id") from None
        if not 0 <= tid < vocab_size:
            raise CompatError(f"{where}: token id {tid} is outside the vocabulary [0, {vocab_size})")
        if not isinstance(v, int | float) or isinstance(v, bool) or not -MAX_BIAS <= v <= MAX_BIAS:
            raise CompatError(f"{where}[{str(k)[:40]!r}]: must be a number in [-{MAX_BIAS:g}, {MAX_BIAS:g}] "
                              f"(got {str(v)[:40]})")
        out[tid] = out.get(tid, 0.0) + float(v)
    return tuple(sorted(out.items()))


def check_custom_params(where: str, value: object, vocab_size: int) -> None:
    """Any JSON value is accepted and ignored; only SGLang's reserved reasoning key is validated."""
    if not isinstance(value, dict) or REASONING_END_KEY not in value:
        return
    ids = value[REASONING_END_KEY]
    if (not isinstance(ids, list) or not ids or len(ids) > MAX_STOP
            or not all(is_int(t) and 0 <= t < vocab_size for t in ids)):
        raise CompatError(f"{where}.{REASONING_END_KEY}: must be a non-empty list of at most {MAX_STOP} token ids "
                          f"in [0, {vocab_size})")


def check_watermark(where: str, value: object) -> None:
    """null and {"enabled": false} change nothing; asking for a watermark is refused (no --enable-watermark)."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise CompatError(f"{where}: must be an object")
    unknown = sorted(set(value) - {"enabled", "key", "context_window"})
    if unknown:
        raise CompatError(f"{where}: unknown field(s) {', '.join(unknown)}")
    enabled, key, window = value.get("enabled"), value.get("key"), value.get("context_window")
    if enabled is not None and not isinstance(enabled, bool):
        raise CompatError(f"{where}.enabled: must be true or false")
    if window is not None and (not is_int(window) or window < 1):
        raise CompatError(f"{where}.context_window: must be a positive integer")
    if enabled is False and key is None:
        return
    if enabled is None and key is None:
        raise CompatError(f"{where}: must set enabled or key")
    raise CompatError(f"{where}: watermarking is not enabled on this engine (SGLang needs --enable-watermark)")


def token_ids_logprob(value: object, count: int, parallel: bool, vocab_size: int) -> list[tuple[int, ...] | None]:
    """GenerateReqInput.token_ids_logprob, one entry per prompt: null/[] = off, a list = every prompt, a list
    of lists = one per prompt (not with n > 1), a bare id = [id]."""
    if value is None or value == []:
        return [None] * count
    if is_int(value):
        value = [value]
    if not isinstance(value, list):
        raise CompatError("token_ids_logprob: must be a list of token ids (or one list per batch entry)")
    per = value if isinstance(value[0], list) else [value] * count
    if per is value:
        if parallel:
            raise CompatError("token_ids_logprob: one list per batch entry cannot be combined with n > 1")
        if len(per) != count:
            raise CompatError(f"token_ids_logprob: has {len(per)} lists for a batch of {count}")
    out: list[tuple[int, ...] | None] = []
    for i, ids in enumerate(per):
        where = f"token_ids_logprob[{i}]" if per is value else "token_ids_logprob"
        if not isinstance(ids, list) or not all(is_int(t) and 0 <= t < vocab_size for t in ids):
            raise CompatError(f"{where}: must be a flat list of token ids in [0, {vocab_size})")
        out.append(tuple(ids) if ids else None)
    return out


class WeightSpan(TypedDict):
    """Output tokens [start, end) that weight `version` produced."""

    version: str
    start: int
    end: int


def weight_version_spans(events: list[tuple[str, int]], current: str, n: int) -> list[WeightSpan]:
    """meta_info.weight_versions: which weights produced which output tokens. events: (version in use
    until then, output tokens at the switch), one per weight update the sequence lived through."""
    spans: list[WeightSpan] = []
    for version, end in [*events, (current, n)]:
        end = min(end, n)
        if spans and end <= spans[-1]["end"]:
            continue
        if spans and spans[-1]["version"] == version:
            spans[-1]["end"] = end
            continue
        spans.append({"version": version, "start": spans[-1]["end"] if spans else 0, "end": end})
    return spans


def stream_due(interval: int | None, sent: int, n: int) -> bool:
    """SGLang's stream_interval rule: the first token at once, then every `interval` unsent tokens."""
    k = interval or 1
    return k == 1 or n - sent >= k or (sent == 0 and n > 0)
