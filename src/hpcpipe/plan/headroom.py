"""How far a job's checkpoint and restart costs are from the point where they cost 5% of goodput.

- ``delta_at_loss``: the largest checkpoint cost δ at which checkpointing at Daly's interval still
  loses at most ``loss`` of the time to checkpoints and rework, with free restarts (R = 0): the
  share a faster checkpoint can win back. It grows linearly with M (≈ loss² · M / 2), so it shrinks
  as the cluster grows.
- ``restart_at_loss``: the largest restart (restart + restore) at which the whole loss, checkpoints
  plus rework plus restarts, stays at most ``loss`` for the given δ. Goodput falls as e^{-R/M} in R
  (``closed_form.py``), so this one is exact: R = M · ln(G(R=0) / (1 - loss)).
"""

from __future__ import annotations

import math

from scipy.optimize import brentq

from hpcpipe.plan.closed_form import daly_interval, goodput

LOSS_BUDGET = 0.05  # the planning line: checkpoints and failures may cost 5% of the GPU time


def loss_at_optimum(delta: float, restart: float, mtbf: float) -> float:
    """1 - goodput at Daly's interval for ``delta``."""
    return 1.0 - float(goodput(daly_interval(delta, mtbf), delta, restart, mtbf))


def delta_at_loss(mtbf: float, loss: float = LOSS_BUDGET) -> float:
    """The δ at which ``loss_at_optimum(δ, 0, M) == loss`` (it rises monotonically with δ)."""
    # Bracket: the loss is ~0 as δ -> 0 and above 90% at δ = 2M (τ = M, E = M (e^3 - 1)).
    return float(brentq(lambda d: loss_at_optimum(d, 0.0, mtbf) - loss, 1e-12 * mtbf, 2.0 * mtbf))


def restart_at_loss(delta: float, mtbf: float, loss: float = LOSS_BUDGET) -> float | None:
    """The R at which the total loss reaches ``loss``; None when δ alone already loses more."""
    free_restart = 1.0 - loss_at_optimum(delta, 0.0, mtbf)
    if free_restart <= 1.0 - loss:
        return None
    return mtbf * math.log(free_restart / (1.0 - loss))
