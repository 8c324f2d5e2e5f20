"""Text rewards: exact match and token F1 against the sample's label.

A label may be one answer or a list of acceptable answers (the best match counts).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_text(text: str) -> str:
    """Lower case, no punctuation, no English articles, single spaces (the usual QA normalisation)."""
    text = str(text).lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _answers(label: Any) -> list[str]:
    if label is None:
        return []
    if isinstance(label, (list, tuple, set)):
        return [str(a) for a in label if a is not None]
    return [str(label)]


def exact_match_score(response: str, label: Any) -> float:
    """1.0 when the normalised response equals a normalised acceptable answer, else 0.0."""
    got = normalize_text(response)
    return 1.0 if any(got == normalize_text(a) for a in _answers(label)) else 0.0


def f1_score(response: str, label: Any) -> float:
    """Token-level F1 between the normalised response and the best acceptable answer."""
    pred = normalize_text(response).split()
    best = 0.0
    for answer in _answers(label):
        gold = normalize_text(answer).split()
        if not pred or not gold:
            best = max(best, float(pred == gold))
            continue
        common = sum((Counter(pred) & Counter(gold)).values())
        if common:
            precision, recall = common / len(pred), common / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def exact_match(sample: Any) -> float:
    return exact_match_score(sample.response, sample.label)


def f1(sample: Any) -> float:
    return f1_score(sample.response, sample.label)
