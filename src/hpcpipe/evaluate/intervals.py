"""Confidence intervals for a pass rate: how far an accuracy on n cases can be from the model's true one.

Wilson's score interval is the binomial proportion interval that stays honest at the sizes an
evaluation has here (20 cases per BFCL category by default) and at 0% or 100%, where the usual
``p ± z·sqrt(p(1-p)/n)`` collapses to a single point.
"""

from __future__ import annotations


def wilson(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval ``(low, high)`` for ``successes`` out of ``n`` trials (SciPy's
    ``binomtest(...).proportion_ci(method="wilson")``): every rate P whose score test would not
    reject ``successes / n``. ``n == 0`` says nothing: ``(0.0, 1.0)``.
    """
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"wilson: need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return 0.0, 1.0
    from scipy.stats import binomtest

    interval = binomtest(successes, n).proportion_ci(confidence_level=confidence, method="wilson")
    return max(0.0, float(interval.low)), min(1.0, float(interval.high))  # 0/n, n/n: exactly 0 and 1


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two intervals share a point."""
    return a[0] <= b[1] and b[0] <= a[1]
