"""Where a training step's time goes: input pipeline, exposed communication, or compute.

Two measured shares decide it, both from ordinary benchmark runs:
- data-wait share = time the trainer waited for the next batch / step time (``data_time_s``);
  above ``INPUT_BOUND_SHARE`` the GPUs (or cores) starve: input-bound.
- exposed communication = step time - step time of the same run with gradient synchronisation
  off (``parallel.sync_gradients=false``): the communication backward did not hide. When it
  exceeds the remaining compute time, the step is communication-bound.
Otherwise the step is compute-bound.
"""

from __future__ import annotations

INPUT_BOUND_SHARE = 0.20


def classify(step_time_s: float, data_time_s: float, exposed_comm_s: float | None) -> str:
    """``input-bound``, ``communication-bound`` or ``compute-bound`` (see the module docstring)."""
    if step_time_s <= 0:
        raise ValueError("step time must be positive")
    if data_time_s / step_time_s > INPUT_BOUND_SHARE:
        return "input-bound"
    comm = max(0.0, exposed_comm_s or 0.0)
    compute = step_time_s - data_time_s - comm
    if comm > compute:
        return "communication-bound"
    return "compute-bound"


def exposed_communication(step_time_s: float, step_time_nosync_s: float | None) -> float | None:
    """Step time not hidden behind compute (0 when the no-sync twin was not slower)."""
    if step_time_nosync_s is None:
        return None
    return max(0.0, step_time_s - step_time_nosync_s)
