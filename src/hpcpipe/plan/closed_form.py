"""Optimal checkpoint intervals and expected goodput under exponential failures.

Symbols (seconds): ``tau`` τ = training time between two checkpoints, ``delta`` δ = what one
checkpoint costs training, ``restart`` R = restart plus restore after a failure, ``mtbf`` M = the
job's mean time between failures (per-GPU MTBF / number of GPUs: any GPU's failure stops the job).

The model (Daly 2006, "A higher order estimate of the optimum checkpoint interval for restart
dumps", FGCS 22): failures arrive as a Poisson process of rate 1/M, at any moment (while
training, checkpointing or restarting). Work runs in segments of τ, each followed by a checkpoint
of δ; the work of a segment counts once its checkpoint completes. A failure loses the segment in
progress (the work since the last completed checkpoint), then a restart of R runs; a failure
during the restart starts it again. The expected wall time of one segment is then

    E = M · e^{R/M} · (e^{(τ+δ)/M} − 1)

and goodput = τ / E. Of E, δ is the completed checkpoint and E − τ − δ is lost to failures
(rework plus restarts).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray


def young_interval(delta: float, mtbf: float) -> float:
    """Young (1974): τ = sqrt(2 δ M), the first-order optimum."""
    return math.sqrt(2.0 * delta * mtbf)


def daly_interval(delta: float, mtbf: float) -> float:
    """Daly (2006): the higher-order optimum, M itself once δ ≥ 2M."""
    if delta >= 2.0 * mtbf:
        return mtbf
    ratio = delta / (2.0 * mtbf)
    return math.sqrt(2.0 * delta * mtbf) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - delta


def segment_time(tau: ArrayLike, delta: float, restart: float, mtbf: float) -> NDArray[np.float64]:
    """Expected wall time to complete one segment of τ work and its checkpoint (module doc)."""
    # expm1: at 16 GPUs (τ+δ)/M is ~1e-3, where exp(x) - 1 would lose digits.
    with np.errstate(over="ignore"):
        return mtbf * np.exp(restart / mtbf) * np.expm1((np.asarray(tau, dtype=float) + delta) / mtbf)


def goodput(tau: ArrayLike, delta: float, restart: float, mtbf: float) -> NDArray[np.float64]:
    """Expected share of wall time spent on work that is kept: τ / E (0 where E overflows)."""
    return np.asarray(tau, dtype=float) / segment_time(tau, delta, restart, mtbf)


def checkpoint_share(tau: float, delta: float, restart: float, mtbf: float) -> float:
    """Share of wall time spent writing the checkpoints that completed: δ / E."""
    return float(delta / segment_time(tau, delta, restart, mtbf))
