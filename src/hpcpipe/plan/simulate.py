"""A Monte-Carlo check of the closed form: many replicas of a long run with random failures.

The simulation makes exactly the closed form's assumptions (``closed_form.py``):

- failures are a Poisson process of rate 1/M (exponential gaps), independent of what the job is
  doing, so they strike during training, checkpoints and restarts alike;
- the job trains in segments of τ, each followed by a checkpoint of δ; a segment's work counts
  only once its checkpoint completes;
- a failure loses the segment in progress and starts a restart of R (restart + restore); a
  failure during a restart starts it again from the beginning;
- the job starts ready to train, as it is after every completed checkpoint.

Each replica completes the same number of segments n (about ``horizon_s`` of training), and the
estimate is n·τ / mean(wall time to complete them). Every segment starts from the same state, so
the expected wall time is exactly n·E of the closed form: no start-up or end-of-run bias, only
sampling error, reported as a standard error.

Because the failures do not depend on the schedule, a replica's failure times are drawn first and
the schedule is laid over them: between two failures the job is ready R after the first (at time
0 for the first stretch) and completes ``floor(available / (τ + δ))`` segments before the second.
That is one vectorised expression over every (replica, failure) pair: 16k GPUs over 30 days with
thousands of replicas take milliseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

# Floats held at once per chunk of replicas (32 MB): bounds memory when failures are frequent.
_CHUNK_FLOATS = 4_000_000
# More expected failures per replica than this and the simulation is skipped (goodput ~0 anyway).
MAX_FAILURES_PER_REPLICA = 1_000_000


@dataclass(frozen=True)
class Simulated:
    """Goodput over ``replicas`` runs of ``segments`` checkpoint intervals: estimate and its
    standard error."""

    goodput: float
    stderr: float
    replicas: int
    segments: int


def simulate_goodput(
    tau: float, delta: float, restart: float, mtbf: float, horizon_s: float, replicas: int, seed: int
) -> Simulated | None:
    """Simulated goodput of checkpointing every ``tau`` (see the module doc for the model); None
    when a replica would see more than ``MAX_FAILURES_PER_REPLICA`` failures."""
    segment = tau + delta
    segments = max(1, math.ceil(horizon_s / segment))
    # Failures expected while completing them: one per M of wall time, which restarts stretch.
    expected = segments * segment / mtbf * math.exp(min(restart / mtbf, 50.0)) * 2.0
    if expected > MAX_FAILURES_PER_REPLICA:
        return None
    rng = np.random.default_rng(seed)
    columns = int(expected + 6.0 * math.sqrt(expected) + 8)  # mean + 6 sigma (Poisson)
    chunk = max(1, _CHUNK_FLOATS // columns)
    walls = []
    for done in range(0, replicas, chunk):
        rows = min(chunk, replicas - done)
        walls.append(_wall_time(rng, rows, columns, tau, delta, restart, mtbf, segments))
    wall = np.concatenate(walls)
    estimate = segments * tau / float(wall.mean())
    spread = float(wall.std(ddof=1) / wall.mean()) if replicas > 1 else math.nan
    return Simulated(estimate, estimate * spread / math.sqrt(replicas), replicas, segments)


def _wall_time(
    rng: np.random.Generator,
    rows: int,
    columns: int,
    tau: float,
    delta: float,
    restart: float,
    mtbf: float,
    segments: int,
) -> NDArray[np.float64]:
    """Per replica: the wall time at which its ``segments``-th checkpoint completes."""
    failures = np.cumsum(rng.exponential(mtbf, (rows, columns)), axis=1)
    while True:
        ready = np.hstack([np.zeros((rows, 1)), failures[:, :-1] + restart])
        # Negative when the next failure struck during the restart: no segment in that stretch.
        completed = np.floor(np.clip(failures - ready, 0.0, None) / (tau + delta))
        total = np.cumsum(completed, axis=1)
        if total[:, -1].min() >= segments:
            break
        more = np.cumsum(rng.exponential(mtbf, (rows, columns)), axis=1) + failures[:, -1:]
        failures = np.hstack([failures, more])  # rare: a replica drew more failures than planned
    stretch = np.argmax(total >= segments, axis=1)  # the stretch where the last segment completes
    row = np.arange(rows)
    before = np.where(stretch > 0, total[row, stretch - 1], 0.0)
    return ready[row, stretch] + (segments - before) * (tau + delta)
