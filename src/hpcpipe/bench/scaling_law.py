"""Scaling-law fits: Kaplan-style L(N), L(D) power laws and the Chinchilla form L(N, D).

- Kaplan et al. (2020): L(N) = (N_c / N)^alpha_N and L(D) = (D_c / D)^alpha_D, each a straight line
  in log-log space. Fitted on the envelope of the runs (the lowest loss at each N, resp. D), the
  runs where the other quantity limits the loss least.
- Hoffmann et al. (2022), approach 3: L(N, D) = E + A / N^alpha + B / D^beta, fitted by minimising
  the Huber loss (delta = 1e-3) between log L and the log of the prediction, written as
  LSE(a - alpha log N, b - beta log D, e) with A = e^a, B = e^b, E = e^e, using L-BFGS from a grid
  of initialisations (alpha, beta in 0..2 by 0.5, e in -1..1 by 0.5, a, b in 0..25 by 5). We
  evaluate the objective on the whole grid and start L-BFGS from its ``starts`` best points
  (the grid's other points lead to the same optimum or a worse one).
- Compute-optimal allocation for C = 6 N D FLOPs (Hoffmann et al., eq. 4):
  N_opt = G (C/6)^(beta/(alpha+beta)), D_opt = G^-1 (C/6)^(alpha/(alpha+beta)),
  G = (alpha A / (beta B))^(1/(alpha+beta)).

Intervals are percentile bootstrap intervals: the fits repeated on points resampled with
replacement (seeded, so the same inputs give the same report). A resample's Chinchilla fit starts
from the full data's optimum, which lies in the resample's basin, instead of from the grid again.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpcpipe.errors import UserError

if TYPE_CHECKING:
    import numpy as np

HUBER_DELTA = 1e-3
GRID = {
    "alpha": [0.0, 0.5, 1.0, 1.5, 2.0],
    "beta": [0.0, 0.5, 1.0, 1.5, 2.0],
    "e": [-1.0, -0.5, 0.0, 0.5, 1.0],
    "a": [0.0, 5.0, 10.0, 15.0, 20.0, 25.0],
    "b": [0.0, 5.0, 10.0, 15.0, 20.0, 25.0],
}
CHINCHILLA_PARAMS = ("E", "A", "B", "alpha", "beta")
# The Huber objective is tiny (residuals ~1e-3, gradients bounded by delta per point): scipy's
# default tolerances stop L-BFGS long before the optimum, so they are tightened here.
LBFGS_OPTIONS = {"gtol": 1e-12, "ftol": 1e-15, "maxiter": 2000}


@dataclass(frozen=True)
class Points:
    """Observations: non-embedding parameters N, training tokens D, final loss L (arrays)."""

    params: np.ndarray
    tokens: np.ndarray
    loss: np.ndarray

    def take(self, index: np.ndarray) -> Points:
        return Points(self.params[index], self.tokens[index], self.loss[index])


# ---------------------------------------------------------------------------------------------
# Kaplan-style single-variable power laws


def envelope(x: np.ndarray, loss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The lowest loss at each distinct x (sorted by x)."""
    import numpy as np

    values = np.unique(x)
    return values, np.array([loss[x == v].min() for v in values])


def power_law_fit(x: np.ndarray, loss: np.ndarray) -> dict[str, float]:
    """L = (x_c / x)^alpha by least squares on log L = alpha log x_c - alpha log x."""
    import numpy as np

    slope, intercept = np.polyfit(np.log(x), np.log(loss), 1)
    alpha = -float(slope)
    if alpha == 0:
        return {"alpha": 0.0, "x_c": float("inf")}
    return {"alpha": alpha, "x_c": float(np.exp(intercept / alpha))}


# ---------------------------------------------------------------------------------------------
# Chinchilla L(N, D)


def _objective(
    theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, log_l: np.ndarray
) -> tuple[float, np.ndarray]:
    """Huber loss of log-space residuals and its gradient w.r.t. theta = (a, b, e, alpha, beta).

    Called thousands of times per fit, so the log-sum-exp and its softmax are written out with
    plain numpy (scipy.special's versions cost more in overhead than the arithmetic here).
    """
    import numpy as np

    a, b, e, alpha, beta = theta
    t1, t2 = a - alpha * log_n, b - beta * log_d  # (P,) each; the third term is e
    top = np.maximum(np.maximum(t1, t2), e)
    x1, x2, x3 = np.exp(t1 - top), np.exp(t2 - top), np.exp(e - top)
    total = x1 + x2 + x3
    residual = top + np.log(total) - log_l  # (P,): log prediction - log observation
    small = np.abs(residual) <= HUBER_DELTA
    loss = np.where(small, 0.5 * residual**2, HUBER_DELTA * (np.abs(residual) - 0.5 * HUBER_DELTA))
    dloss = np.where(small, residual, HUBER_DELTA * np.sign(residual)) / total  # (P,), softmax folded in
    g1, g2 = dloss * x1, dloss * x2
    grad = np.array([g1.sum(), g2.sum(), (dloss * x3).sum(), -(g1 * log_n).sum(), -(g2 * log_d).sum()])
    return float(loss.sum()), grad


def _grid_objective(log_n: np.ndarray, log_d: np.ndarray, log_l: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The objective at every grid point at once: (grid points (G, 5), objective (G,))."""
    import numpy as np

    grid = np.array(list(itertools.product(GRID["a"], GRID["b"], GRID["e"], GRID["alpha"], GRID["beta"])))
    a, b, e, alpha, beta = (grid[:, i : i + 1] for i in range(5))  # (G, 1) each
    t1, t2 = a - alpha * log_n, b - beta * log_d  # (G, P) each
    top = np.maximum(np.maximum(t1, t2), e)
    log_pred = top + np.log(np.exp(t1 - top) + np.exp(t2 - top) + np.exp(e - top))
    residual = np.abs(log_pred - log_l)  # (G, P)
    huber = np.where(residual <= HUBER_DELTA, 0.5 * residual**2, HUBER_DELTA * (residual - 0.5 * HUBER_DELTA))
    return grid, huber.sum(axis=1)


def chinchilla_fit(points: Points, starts: int = 16, init: np.ndarray | None = None) -> dict[str, Any]:
    """Fit E, A, B, alpha, beta: L-BFGS from the ``starts`` best grid points, or from ``init`` alone.

    Returns the parameters, the fitted theta (a, b, e, alpha, beta) and the final objective.
    """
    import numpy as np
    from scipy.optimize import minimize

    log_n, log_d, log_l = np.log(points.params), np.log(points.tokens), np.log(points.loss)
    if init is None:
        grid, values = _grid_objective(log_n, log_d, log_l)
        inits = [grid[i] for i in np.argsort(values)[:starts]]
    else:
        inits = [init]
    best = None
    for start in inits:
        result = minimize(
            _objective, start, args=(log_n, log_d, log_l), jac=True, method="L-BFGS-B", options=LBFGS_OPTIONS
        )
        if best is None or result.fun < best.fun:
            best = result
    assert best is not None
    a, b, e, alpha, beta = (float(v) for v in best.x)
    return {
        "E": float(np.exp(e)),
        "A": float(np.exp(a)),
        "B": float(np.exp(b)),
        "alpha": alpha,
        "beta": beta,
        "theta": best.x,
        "objective": float(best.fun),
    }


def predict(fit: dict[str, Any], params: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    return fit["E"] + fit["A"] / params ** fit["alpha"] + fit["B"] / tokens ** fit["beta"]


def compute_optimal(fit: dict[str, Any], flops: float) -> dict[str, float]:
    """N_opt and D_opt minimising L(N, D) subject to 6 N D = flops (Hoffmann et al., eq. 4)."""
    alpha, beta = fit["alpha"], fit["beta"]
    if alpha <= 0 or beta <= 0:
        return {"params": float("nan"), "tokens": float("nan")}
    g = (alpha * fit["A"] / (beta * fit["B"])) ** (1.0 / (alpha + beta))
    n_opt = g * (flops / 6.0) ** (beta / (alpha + beta))
    return {"params": n_opt, "tokens": flops / 6.0 / n_opt}


# ---------------------------------------------------------------------------------------------
# Everything, with bootstrap intervals


def fit_all(
    points: Points, flops: float | None, bootstrap: int, seed: int, confidence: float = 0.95
) -> dict[str, Any]:
    """The Kaplan and Chinchilla fits, the compute-optimal N and D, each with a bootstrap interval."""
    import numpy as np

    _check_points(points)
    main = _fit_once(points, flops, init=None)
    rng = np.random.default_rng(seed)
    samples: list[dict[str, float]] = []
    for _ in range(bootstrap):
        index = rng.integers(0, len(points.loss), len(points.loss))
        sample = points.take(index)
        if len(np.unique(sample.params)) < 2 or len(np.unique(sample.tokens)) < 2:
            continue  # a resample without spread in N or D cannot identify the fit
        samples.append(_flatten(_fit_once(sample, flops, init=main["chinchilla"]["theta"])))
    flat = _flatten(main)
    low, high = (1 - confidence) / 2 * 100, (1 + confidence) / 2 * 100
    intervals = {
        key: [
            float(np.percentile([s[key] for s in samples], low)),
            float(np.percentile([s[key] for s in samples], high)),
        ]
        for key in flat
        if samples and all(np.isfinite(s[key]) for s in samples)
    }
    quality = chinchilla_quality(points, main["chinchilla"]["theta"])
    main["chinchilla"].pop("theta")
    return {
        **main,
        "quality": quality,
        "intervals": intervals,
        "bootstrap": len(samples),
        "confidence": confidence,
        "seed": seed,
        "n_points": len(points.loss),
    }


def chinchilla_quality(points: Points, theta: np.ndarray) -> dict[str, float]:
    """How well L(N, D) describes the runs and predicts each one it did not see: the RMSE of
    log-loss residuals in sample, and leave-one-out (each run's loss predicted by a fit of the
    others). Five parameters through a few points fit anything (an outlier gave alpha 23.8); the
    held-out error says whether it is a law or a description of these points."""
    import numpy as np

    def rmse(fit: dict[str, Any], index: np.ndarray) -> float:
        sample = points.take(index)
        residual = np.log(predict(fit, sample.params, sample.tokens)) - np.log(sample.loss)
        return float(np.sqrt(np.mean(residual**2)))

    everything = np.arange(len(points.loss))
    errors = []
    for held in everything:
        others = points.take(everything[everything != held])
        errors.append(rmse(chinchilla_fit(others, init=theta), np.array([held])))
    in_sample = rmse(chinchilla_fit(points, init=theta), everything)
    return {"log_rmse": in_sample, "loo_log_rmse": float(np.sqrt(np.mean(np.square(errors))))}


def _fit_once(points: Points, flops: float | None, init: np.ndarray | None) -> dict[str, Any]:
    n_env, ln = envelope(points.params, points.loss)
    d_env, ld = envelope(points.tokens, points.loss)
    chin = chinchilla_fit(points, init=init)
    result: dict[str, Any] = {
        "kaplan_n": power_law_fit(n_env, ln),
        "kaplan_d": power_law_fit(d_env, ld),
        "chinchilla": chin,
    }
    if flops is not None:
        result["compute_optimal"] = {"flops": flops, **compute_optimal(chin, flops)}
    return result


def _flatten(result: dict[str, Any]) -> dict[str, float]:
    flat = {f"kaplan_n.{k}": v for k, v in result["kaplan_n"].items()}
    flat.update({f"kaplan_d.{k}": v for k, v in result["kaplan_d"].items()})
    flat.update({f"chinchilla.{k}": result["chinchilla"][k] for k in CHINCHILLA_PARAMS})
    if "compute_optimal" in result:
        flat["compute_optimal.params"] = result["compute_optimal"]["params"]
        flat["compute_optimal.tokens"] = result["compute_optimal"]["tokens"]
    return flat


def _check_points(points: Points) -> None:
    import numpy as np

    values = np.concatenate([points.params, points.tokens, points.loss])
    if not np.isfinite(values).all():  # a diverged run's NaN loss left the fit at its grid start
        raise UserError("scaling-law fit: params, tokens and loss must be finite (a diverged run?)")
    if len(points.loss) <= len(CHINCHILLA_PARAMS):  # as many points as parameters fit anything
        raise UserError(
            f"scaling-law fit: need more runs than L(N, D)'s {len(CHINCHILLA_PARAMS)} parameters, "
            f"got {len(points.loss)}"
        )
    if len(np.unique(points.params)) < 2 or len(np.unique(points.tokens)) < 2:
        raise UserError("scaling-law fit: the runs need at least two model sizes and two token counts")
    if (points.params <= 0).any() or (points.tokens <= 0).any() or (points.loss <= 0).any():
        raise UserError("scaling-law fit: params, tokens and loss must all be positive")
