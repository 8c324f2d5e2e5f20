"""Math reward: extract the final answer (\\boxed{...}, "the answer is ...", "#### ...") and compare it
with the label after normalisation, so that 1/2, 0.5, \\frac{1}{2}, \\dfrac12 and $\\frac 1 2$ agree.

1.0 when equivalent, else 0.0. Without an explicit final answer the response scores 0: taking
the last number of a response would reward listing numbers.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

_BOXED = ("\\boxed", "\\fbox")
_ANSWER_IS = re.compile(r"(?:final answer|the answer)\s*(?:is|:)\s*(.+)", re.IGNORECASE)
_ANSWER_LINE = re.compile(r"^\s*answer\s*:\s*(.+)$", re.IGNORECASE | re.MULTILINE)
_HASHES = re.compile(r"####\s*(.+)")
_THOUSANDS = re.compile(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$")
_NUMBER = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")
_FRACTION = re.compile(r"^([-+]?\d+)/([-+]?\d+)$")


def _braced(text: str, start: int) -> tuple[str, int] | None:
    """The content of the brace group opening at text[start] == '{', and the index after it."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1:i], i + 1
    return None


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}, or `\\boxed 5`), braces balanced."""
    best: tuple[int, str] | None = None
    for macro in _BOXED:
        pos = text.rfind(macro)
        if pos < 0 or (best is not None and pos < best[0]):
            continue
        rest = pos + len(macro)
        if rest < len(text) and text[rest] == "{":
            found = _braced(text, rest)
            if found is not None:
                best = (pos, found[0])
        elif rest < len(text) and text[rest] == " ":
            best = (pos, text[rest + 1:].split("$")[0].split()[0] if text[rest + 1:].split() else "")
    return best[1] if best else None


def extract_answer(text: str) -> str | None:
    """The final answer a response states, or None when it states none."""
    text = str(text)
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    for pattern in (_HASHES, _ANSWER_IS, _ANSWER_LINE):
        matches = pattern.findall(text)
        if matches:
            answer = matches[-1].strip().splitlines()[0] if matches[-1].strip() else ""
            boxed = last_boxed(answer)
            return boxed if boxed is not None else answer
    return None


def _unwrap_frac(text: str) -> str:
    """\\frac{a}{b} -> (a)/(b); \\frac12 -> 1/2; \\dfrac and \\tfrac alike."""
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    out, i = [], 0
    while True:
        j = text.find("\\frac", i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:j])
        k = j + len("\\frac")
        parts = []
        for _ in range(2):
            while k < len(text) and text[k] == " ":
                k += 1
            if k < len(text) and text[k] == "{":
                found = _braced(text, k)
                if found is None:
                    break
                parts.append(_unwrap_frac(found[0]))
                k = found[1]
            elif k < len(text):
                parts.append(text[k])
                k += 1
        if len(parts) != 2:
            out.append(text[j:])
            return "".join(out)
        num, den = (p if re.fullmatch(r"[-\w.]+", p) else f"({p})" for p in parts)
        out.append(f"{num}/{den}")
        i = k


def normalize_answer(answer: Any) -> str:
    """A canonical string form of a math answer (numbers come out as reduced fractions or integers)."""
    text = str(answer).strip()
    boxed = last_boxed(text)
    if boxed is not None:
        text = boxed
    text = text.strip().strip("$").strip()
    for a, b in (("\\(", ""), ("\\)", ""), ("\\[", ""), ("\\]", ""), ("\\left", ""), ("\\right", ""),
                 ("\\!", ""), ("\\,", ""), ("\\;", ""), ("\\:", ""), ("\\ ", ""), ("\\displaystyle", ""),
                 ("^\\circ", ""), ("^{\\circ}", ""), ("\\circ", ""), ("\\$", ""), ("\\%", "%"), ("$", "")):
        text = text.replace(a, b)
    text = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", text)
    text = re.sub(r"\\sqrt\s*(\w)", r"\\sqrt{\1}", text)  # \sqrt3 -> \sqrt{3}
    text = _unwrap_frac(text)
    text = re.sub(r"\((\\?\w+(?:\{[^{}]*\})?)\)", r"\1", text)  # (\sqrt{3})/2 -> \sqrt{3}/2
    text = text.rstrip(".").strip()
    text = re.sub(r"^[a-zA-Z]\s*=\s*", "", text)  # "x = 5" -> "5"
    text = "".join(text.split())
    if _THOUSANDS.match(text):
        text = text.replace(",", "")
    if text.endswith("%"):
        text = text[:-1]
    number = _as_number(text)
    if number is not None:
        return str(number.numerator) if number.denominator == 1 else f"{number.numerator}/{number.denominator}"
    return text


def _as_number(text: str) -> Fraction | None:
    text = text.strip("()") if re.fullmatch(r"\([^()]*\)", text) else text
    try:
        if _NUMBER.match(text):
            return Fraction(text)
        match = _FRACTION.match(text.replace("(", "").replace(")", ""))
        if match and int(match.group(2)) != 0:
            return Fraction(int(match.group(1)), int(match.group(2)))
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    return None


def is_equivalent(answer: Any, label: Any) -> bool:
    return normalize_answer(answer) == normalize_answer(label)


def math_score(response: str, label: Any) -> float:
    """1.0 when the response's final answer equals the label after normalisation, else 0.0."""
    if label is None:
        return 0.0
    answer = extract_answer(response)
    if answer is None:
        return 0.0
    labels = label if isinstance(label, (list, tuple)) else [label]
    gold = [extract_answer(str(x)) or str(x) for x in labels]
    return 1.0 if any(is_equivalent(answer, g) for g in gold) else 0.0


def math_reward(sample: Any) -> float:
    return math_score(sample.response, sample.label)
