"""The unit of rollout data: one response to one prompt, with everything training needs."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Status(enum.StrEnum):
    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"

    @classmethod
    def from_finish_reason(cls, finish_type: str) -> Status:
        """SGLang finish types: length -> truncated, abort -> aborted, stop -> completed."""
        return {"length": cls.TRUNCATED, "abort": cls.ABORTED, "stop": cls.COMPLETED}.get(finish_type, cls.FAILED)


@dataclass
class Sample:
    """tokens = prompt tokens + response tokens; the last `response_length` tokens are the response.

    loss_mask and rollout_log_probs have one entry per response token (mask 0 = context the
    model did not sample, e.g. tool output inside an agent trajectory).
    """

    prompt: str | list[dict[str, Any]] = ""
    label: Any = None
    group_index: int = 0
    index: int = 0
    rollout_id: int | None = None  # siblings of one agent rollout share it
    session_id: str | None = None
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    teacher_log_probs: list[float] | None = None
    teacher: str | None = None  # the name of the teacher that scored it (routed by its source: config/teachers.py)
    reward: Any = None  # float | int | bool | dict | None; normalised by slimecli.reward
    status: Status = Status.PENDING
    weight_versions: list[str] = field(default_factory=list)  # the engine's weight_version of each generation call
    token_versions: list[int] | None = None  # per response token: the weight version that sampled it (-1: unknown)
    remove_sample: bool = False  # keep in the batch, zero its loss mask at train time
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    def effective_loss_mask(self) -> list[int]:
        if self.remove_sample:
            return [0] * self.response_length
        return list(self.loss_mask) if self.loss_mask is not None else [1] * self.response_length

    def append_response(self, token_ids: list[int], log_probs: list[float] | None, trainable: bool = True,
                        versions: list[int] | None = None) -> None:
        """Add tokens to the response; sampled (trainable) tokens must come with their log-probs, and may come
        with the weight version that sampled each."""
        if trainable and (log_probs is None or len(log_probs) != len(token_ids)):
            raise ValueError(f"{len(token_ids)} trainable tokens need as many log-probs, got "
                             f"{None if log_probs is None else len(log_probs)}")
        if self.loss_mask is None:
            self.loss_mask = [1] * self.response_length
        if self.rollout_log_probs is None:
            self.rollout_log_probs = [0.0] * self.response_length
        self.tokens.extend(token_ids)
        self.response_length += len(token_ids)
        self.loss_mask.extend([1 if trainable else 0] * len(token_ids))
        self.rollout_log_probs.extend(log_probs if trainable and log_probs is not None else [0.0] * len(token_ids))
        if versions is not None or self.token_versions is not None:
            known = self.token_versions if self.token_versions is not None else [-1] * (self.response_length
                                                                                         - len(token_ids))
            known.extend(versions if versions is not None and len(versions) == len(token_ids) else
                         [-1] * len(token_ids))
            self.token_versions = known

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["status"] = self.status.value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        data = dict(data)
        data["status"] = Status(data.get("status", "pending"))
        return cls(**data)

    @classmethod
    def aborted(cls, reason: str, **fields: Any) -> Sample:
        """The placeholder for an agent run that produced nothing trainable (one masked token after at least one
        prompt token, so that it packs like any sample)."""
        metadata = {**fields.pop("metadata", {}), "abort_reason": reason}
        return cls(response="", response_length=1, tokens=[*(fields.pop("tokens", None) or [0]), 0], loss_mask=[0],
                   rollout_log_probs=[0.0], reward=0.0, remove_sample=True, status=Status.ABORTED,
                   metadata=metadata, **fields)


def version_number(version: str | None) -> int:
    """An engine's weight_version as a step number: SGLang's "default" (the weights it started with) is 0, a
    number is itself, a LoRA adapter's "policy-v<N>" is N; anything else is -1 (unknown)."""
    text = str(version or "")
    if text == "default":
        return 0
    text = text.rpartition("-v")[2] if "-v" in text else text
    return int(text) if text.isdigit() else -1


def token_versions(meta: dict[str, Any], n: int) -> list[int]:
    """The weight version of each of a reply's ``n`` output tokens: the engine's meta_info.weight_versions spans
    where it reports them (a request that lived through a weight update), else its one weight_version."""
    spans = meta.get("weight_versions")
    if not isinstance(spans, list) or not spans:
        return [version_number(meta.get("weight_version"))] * n
    out: list[int] = []
    for span in spans:
        out.extend([version_number(span.get("version"))] * max(0, int(span.get("end", 0)) - int(span.get("start", 0))))
    return (out + [out[-1] if out else -1] * n)[:n]
