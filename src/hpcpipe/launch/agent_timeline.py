"""The elastic agent's restarts, timed: one ``agent_restart`` line per restart in ``events.jsonl``.

torch's agent publishes its own metrics through ``torch.distributed.elastic.metrics`` (public:
``configure`` a handler for the ``torchelastic`` group): after every poll of its workers it puts
``workers.<role>.<state>``, and each step it times with ``@prof`` ends with a
``<Class>.<method>.duration.ms`` metric (which methods: ``compat.elastic_agent_step``). While
``run_agent`` runs, ``recording_restarts`` installs a handler that passes every metric on to the
one configured before and turns a restart's metrics into wall-clock milestones:

``failure_seen``
    The start of the poll that found a failed (or unhealthy) worker. That poll also signals the
    surviving workers and waits for them: torch's process context closes itself on the first
    failure it sees.
``workers_stopped``
    The end of ``_stop_workers``: every old worker is gone.
``rendezvous_done``
    The end of the agent's rendezvous round (a new round for every restart).
``workers_started``
    The end of ``_start_workers``: the new worker processes are requested (forked or spawned).

A restart for a membership change (a node joined) has ``failure_seen: null``. The chaos harness
(``chaos/phases.py``) reads these with the workers' own timestamps (``group_start``) to split a
time to recover into phases. Like every observer, the handler never fails the agent.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch.distributed.elastic import metrics

from hpcpipe.compat import elastic_agent_step

log = logging.getLogger("hpcpipe.launch")

EVENT = "agent_restart"
_FAILED_STATES = ("failed", "unhealthy")


class RestartTimeline(metrics.MetricHandler):
    """A metrics handler that writes one ``agent_restart`` event per restart of the worker group
    into ``run_dir`` and passes every metric on to ``previous``."""

    def __init__(self, run_dir: Path, previous: metrics.MetricHandler | None, node: str) -> None:
        self.run_dir = run_dir
        self.previous = previous
        self.node = node
        self.restarts = 0
        self._poll_started: float | None = None
        self._milestones: dict[str, float | None] = {}

    def emit(self, metric_data: metrics.MetricData) -> None:
        try:
            self._note(str(metric_data.name), float(metric_data.timestamp), metric_data.value)
        except Exception:  # an observer: never the agent's failure
            log.debug("agent timeline: metric %r not understood", metric_data, exc_info=True)
        if self.previous is not None:
            self.previous.emit(metric_data)

    def _note(self, name: str, at: float, value: Any) -> None:
        step = elastic_agent_step(name)
        if step == "poll":
            self._poll_started = at - float(value) / 1000.0  # value: the poll's duration in ms
        elif step is None and name.startswith("workers.") and name.rsplit(".", 1)[-1] in _FAILED_STATES:
            self._milestones = {"failure_seen": self._poll_started}
        elif step == "stop":
            self._milestones = {"failure_seen": self._milestones.get("failure_seen"), "workers_stopped": at}
        elif step == "rendezvous":
            self._milestones["rendezvous_done"] = at
        elif step == "start":
            self._milestones["workers_started"] = at
        elif step == "restart":
            self.restarts += 1
            self._write(self._milestones)
            self._milestones = {}

    def _write(self, milestones: dict[str, float | None]) -> None:
        from hpcpipe.observe.metrics import append_event

        fields = {
            "node": self.node,
            "restart": self.restarts,
            "failure_seen": milestones.get("failure_seen"),
            "workers_stopped": milestones.get("workers_stopped"),
            "rendezvous_done": milestones.get("rendezvous_done"),
            "workers_started": milestones.get("workers_started"),
        }
        try:
            append_event(self.run_dir, EVENT, **fields)
        except OSError as exc:  # no run directory (yet) on this node: nothing to record into
            log.debug("agent timeline: %s not written: %s", EVENT, exc)


@contextlib.contextmanager
def recording_restarts(run_dir: str | None) -> Iterator[RestartTimeline | None]:
    """While the block runs, the agent's restarts go into ``run_dir``'s ``events.jsonl``
    (nothing happens for None); the handler configured before is restored afterwards."""
    if run_dir is None:
        yield None
        return
    from hpcpipe.train.environment import node_name

    group = "torchelastic"
    previous = metrics.getStream(group).handler
    timeline = RestartTimeline(Path(run_dir), previous, node_name())
    metrics.configure(timeline, group)
    try:
        yield timeline
    finally:
        metrics.configure(previous, group)
