"""The unbiased pass@k estimator (Chen et al., 2021): with n samples of a prompt of which c pass,
pass@k = 1 - C(n - c, k) / C(n, k), the chance that k samples drawn without replacement hold a pass."""

from __future__ import annotations

from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """The estimate for one prompt (n samples, c of them passing), computed as a stable product."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def powers_of_two(n: int) -> list[int]:
    """1, 2, 4, ... up to n: the k reported for n samples a prompt."""
    out, k = [], 1
    while k <= n:
        out.append(k)
        k *= 2
    return out


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float | None:
    """pass@k averaged over prompts, each (n, c); prompts with fewer than k (valid) samples are left out."""
    values = [pass_at_k(n, c, k) for n, c in counts if n >= k]
    return sum(values) / len(values) if values else None
