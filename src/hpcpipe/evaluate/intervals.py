"""Confidence intervals for a pass rate: how far an accuracy on n cases can be from the model's true one.

Wilson's score interval is the binomial proportion interval that stays honest at the sizes an
evaluation has here (20 cases per BFCL category by default) and at 0% or 100%, where the usual
``p ± z·sqrt(p(1-p)/n)`` collapses to a single point.
"""

from __future__ import annotations

from math import sqrt

Z95 = 1.96  # two-sided 95%: the standard normal's 97.5th percentile


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval ``(low, high)`` for ``successes`` out of ``n`` trials.

    The interval holds every rate P whose normal test would not reject ``successes / n``:
    center ``(p + z²/2n) / (1 + z²/n)``, half-width ``z / (1 + z²/n) · sqrt(p(1-p)/n + z²/4n²)``.
    ``n == 0`` says nothing: ``(0.0, 1.0)``.
    """
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"wilson: need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2n = z * z / n
    center = (p + z2n / 2) / (1 + z2n)
    half = z / (1 + z2n) * sqrt(p * (1 - p) / n + z2n / (4 * n))
    return max(0.0, center - half), min(1.0, center + half)  # 0/n and n/n: exact 0 and 1, not ±1e-17


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two intervals share a point."""
    return a[0] <= b[1] and b[0] <= a[1]
