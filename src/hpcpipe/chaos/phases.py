"""A recovery's time, split into phases: where the seconds between a fault and the next step go.

The milestones come from what the run recorded (``events.jsonl``, ``metrics.jsonl``), all wall
clock, in the order a restart passes them:

============================  ====================================================================
milestone                     recorded by
============================  ====================================================================
``failure_seen``              the agent's poll that found a failed worker (``agent_restart``,
                              ``launch/agent_timeline.py``)
``workers_stopped``           the agent: every old worker gone (``agent_restart``)
``rendezvous_done``           the agent's rendezvous round (``agent_restart``)
``workers_started``           the agent asked for the new workers (``agent_restart``)
``worker_start``              the last new worker process started (``group_start``, ``/proc``)
``worker_running``            ... and runs trainer code, imports done (``group_start``)
``pg_up``                     ``init_process_group`` returned on every rank (``group_start``)
``restore_start``             the trainer starts to choose, verify and load a checkpoint
                              (``resumed``: its time less ``restore_s``)
``restored``                  the checkpoint is loaded (``resumed``)
``first_step``                the first training step logged after the fault (``metrics.jsonl``):
                              where the time to recover ends
============================  ====================================================================

Each interval between two consecutive milestones belongs to one phase (``CHAIN``): detection,
teardown, spawn + import, rendezvous (the agent's round and the process group's), setup (recipe,
barriers, lineage, model, DDP, optimizer, loader), restore, first step. When a milestone is
missing (a run that restarted without a checkpoint has no ``resumed``; a recovery by a new
``hpcpipe train``, as after a killed save, has no agent restart), the interval across it goes to
its phase if both sides belong to the same one, else to ``other``. So the phases always add up to
the time to recover.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PHASES = ("detection", "teardown", "spawn_import", "rendezvous", "setup", "restore", "first_step")
OTHER = "other"
LABELS = {
    "detection": "detection",
    "teardown": "teardown",
    "spawn_import": "spawn + import",
    "rendezvous": "rendezvous",
    "setup": "setup",
    "restore": "restore",
    "first_step": "first step",
    OTHER: "other",
}

# Each milestone, in order, with the phase of the interval that ends at it.
CHAIN = (
    ("failure_seen", "detection"),
    ("workers_stopped", "teardown"),
    ("rendezvous_done", "rendezvous"),
    ("workers_started", "spawn_import"),
    ("worker_start", "spawn_import"),
    ("worker_running", "spawn_import"),
    ("pg_up", "rendezvous"),
    ("restore_start", "setup"),
    ("restored", "restore"),
    ("first_step", "first_step"),
)
AGENT_MILESTONES = ("failure_seen", "workers_stopped", "rendezvous_done", "workers_started")
GROUP_MILESTONES = ("worker_start", "worker_running", "pg_up")


def split(milestones: dict[str, float], since: float) -> dict[str, float] | None:
    """Seconds per phase from ``since`` (the fault) to ``milestones["first_step"]``; None without
    a first step. A milestone out of order (before the one it follows, or after the first step)
    counts as missing. Only the phases that were measured are keys, plus ``other`` always."""
    end = milestones.get("first_step")
    if end is None or end < since:
        return None
    phases: dict[str, float] = {OTHER: 0.0}
    last_time, last_index = since, -1
    for index, (name, _) in enumerate(CHAIN):
        at = milestones.get(name)
        if at is None or at < last_time or at > end:
            continue
        spanned = {phase for _, phase in CHAIN[last_index + 1 : index + 1]}
        key = spanned.pop() if len(spanned) == 1 else OTHER
        phases[key] = phases.get(key, 0.0) + (at - last_time)
        last_time, last_index = at, index
    return {key: round(value, 3) for key, value in phases.items()}


def milestones(
    events: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]], since: float
) -> dict[str, float]:
    """The milestones of the first recovery after ``since`` (module doc), from a run's events
    and metrics rows; those it did not record are left out."""
    found: dict[str, float] = {}
    after = since
    restart = _first(events, "agent_restart", lambda e: _number(e.get("workers_stopped"), since) is not None)
    if restart is not None:
        found.update({k: v for k in AGENT_MILESTONES if (v := _number(restart.get(k))) is not None})
        after = found.get("workers_stopped", after)
    start = _first(events, "group_start", lambda e: float(e["time"]) > after)
    if start is not None:
        found.update({k: v for k in GROUP_MILESTONES if (v := _number(start.get(k))) is not None})
        resumed = _first(events, "resumed", lambda e: float(e["time"]) > float(start["time"]))
        if resumed is not None:
            found["restored"] = float(resumed["time"])
            if (took := _number(resumed.get("restore_s"))) is not None:
                found["restore_start"] = found["restored"] - took
    steps = [float(r["time"]) for r in rows if "loss" in r and _number(r.get("time"), since) is not None]
    if steps:
        found["first_step"] = min(steps)
    return found


def _first(events: Sequence[dict[str, Any]], kind: str, keep: Any) -> dict[str, Any] | None:
    """The earliest ``kind`` event that ``keep`` accepts."""
    chosen = [e for e in events if e.get("event") == kind and _number(e.get("time")) is not None and keep(e)]
    return min(chosen, key=lambda e: float(e["time"]), default=None)


def _number(value: Any, above: float | None = None) -> float | None:
    """``value`` as a float (None for anything else, or when not above ``above``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if above is not None and value <= above:
        return None
    return float(value)
