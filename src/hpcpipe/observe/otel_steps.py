"""The trainer's spans: sampled training steps with their phases, and checkpoints from their events.

``StepTracer`` is a ``PhaseListener`` (``phases.py``): the loop tells it every step and phase
boundary on the training thread. Every ``sample_every_steps``-th step becomes a trace (ids:
``otel_ids.py``)::

    train_step                    rank 0: the root (links to hpcpipe run's train step)
    ├ data, forward, comm, backward, optimizer     rank 0's phases, once per micro-step
    ├ all_reduce_metrics, checkpoint_save, ...     rank 0's regions after the step, nested
    ├ checkpoint.stage / .save / .verify           from rank 0's checkpoint events
    └ train_step                  rank r: parent is rank 0's step span
      └ rank r's phases and regions

The regions the loop runs between two steps (logging's all-reduce, a checkpoint, an evaluation)
belong to the step before them, as children of its (ended) span; before the first step, or after
an untraced one, they are not traced. Checkpoint spans come from the store's events, always,
whatever the sampling: a span ends when its event arrives and starts the duration the event
carries before (``write_s``, ``load_s``, ...); a verification starts at its checkpoint's commit,
when it was queued. A checkpoint of an untraced step, and a restore, is its step trace's root.

**Logs join traces.** ``event_context`` is the ``EventLog``'s ``context``: each line written to
``events.jsonl`` gets ``trace_id`` and ``span_id`` when a span is current on the training thread,
or the ids of the span the event itself became.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import Span
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags
from opentelemetry.trace import set_span_in_context as under

from hpcpipe.config.observe import OtelConfig
from hpcpipe.errors import hide_credentials
from hpcpipe.observe import otel_export
from hpcpipe.observe.metrics import EventLog
from hpcpipe.observe.otel_ids import TraceParent, Who, step_span_id, step_trace_id
from hpcpipe.observe.phases import PhaseListener

log = logging.getLogger("hpcpipe.observe")

STEP_SPAN = "train_step"


@dataclass(frozen=True)
class _FromEvent:
    name: str
    seconds: str | None  # the event's field holding the duration (None: none; see _start_ns)
    error: bool = False


FROM_EVENTS = {
    "checkpoint_staged": _FromEvent("checkpoint.stage", "blocking_s"),
    "checkpoint_committed": _FromEvent("checkpoint.save", "write_s"),
    "checkpoint_save_failed": _FromEvent("checkpoint.save", None, error=True),
    "checkpoint_verified": _FromEvent("checkpoint.verify", None),
    "checkpoint_verify_failed": _FromEvent("checkpoint.verify", None, error=True),
    "checkpoint_restored": _FromEvent("checkpoint.restore", "load_s"),
    "checkpoint_durable_copied": _FromEvent("checkpoint.durable_copy", "copy_s"),
}
"""Store events (``checkpoint/store.py``) that become spans."""


def _context(trace_id: int, span_id: int, remote: bool) -> Context:
    """A parent context naming a span by its ids (another rank's, or one of ours already ended)."""
    parent = SpanContext(trace_id, span_id, is_remote=remote, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return under(NonRecordingSpan(parent))


def _ids(context: SpanContext) -> dict[str, str]:
    """The fields a log line carries: W3C's lowercase hex, as Loki/Tempo and collectors read them."""
    return {"trace_id": format(context.trace_id, "032x"), "span_id": format(context.span_id, "016x")}


class StepTracer(PhaseListener):
    """One rank's training spans (see the module docstring); ``close`` sends and reports."""

    def __init__(self, cfg: OtelConfig, who: Who, events: EventLog, pipeline: TraceParent | None) -> None:
        self.who, self.events, self.every = who, events, cfg.sample_every_steps
        self.endpoint = cfg.traces_url
        attributes = otel_export.resource_attributes(cfg, who.run, who.rank, who.host)
        self.tracing = otel_export.acquire(cfg, attributes, loud=who.rank == 0)
        self.tracing.exporter.on_unreachable.append(self._unreachable)
        self._links: list[Link] = []
        if pipeline is not None and who.rank == 0:  # `hpcpipe run`'s train step (TRACEPARENT)
            origin = SpanContext(pipeline.trace_id, pipeline.span_id, True, TraceFlags(TraceFlags.SAMPLED))
            self._links.append(Link(origin, {"hpcpipe.link": "pipeline"}))
        self._thread = threading.get_ident()  # the training thread: phases and current spans live there
        self._step: Span | None = None  # the traced step's span; after it ends, the regions' parent
        self._in_step = False
        self._open: list[Span] = []  # phases and regions open on the training thread, innermost last
        self._attributes: dict[str, Any] = {}
        self._ran = (0, -1)  # the first and last step this process ran
        self._commits: dict[int, int] = {}  # step -> commit time (ns): a verification starts there
        self._closed = False
        events.context = self.event_context

    # -- the loop's boundaries (training thread) ---------------------------------------------------

    def traced(self, step: int) -> bool:
        return step > 0 and step % self.every == 0

    def step_begin(self, step: int) -> None:
        self._ran = (self._ran[0] or step, step)
        self._open.clear()
        self._in_step = self.traced(step)
        self._step = self._start_step(step) if self._in_step else None

    def _start_step(self, step: int) -> Span:
        run, attempt, rank = self.who.run, self.who.attempt, self.who.rank
        self._attributes = self._base(step)
        trace_id = step_trace_id(run, attempt, step)
        parent = Context() if rank == 0 else _context(trace_id, step_span_id(run, attempt, step, 0), True)
        return self.tracing.start_span(
            STEP_SPAN,
            parent,
            {**self._attributes, "hpcpipe.run.attempt": attempt},
            trace_id=trace_id,
            span_id=step_span_id(run, attempt, step, rank),
            links=self._links,
        )

    def _base(self, step: int) -> dict[str, Any]:
        who = self.who
        return {
            "hpcpipe.run.id": who.run,
            "hpcpipe.rank": who.rank,
            "host.name": who.host,
            "hpcpipe.step": step,
        }

    def phase_begin(self, phase: str) -> None:
        parent = self._open[-1] if self._open else self._step
        if parent is not None:
            self._open.append(self.tracing.start_span(phase, under(parent), self._attributes))

    def phase_end(self, phase: str) -> None:
        for index in range(len(self._open) - 1, -1, -1):
            if self._open[index].name == phase:
                for span in reversed(self._open[index:]):
                    span.end()
                del self._open[index:]
                return

    def step_end(self, step: int) -> None:
        if self._step is None or not self._in_step:
            return
        for span in reversed(self._open):
            span.end()
        self._open.clear()
        self._step.end()
        self._in_step = False

    # -- events: spans of their own, and the ids their lines carry -----------------------------------

    def event_context(self, kind: str, fields: dict[str, Any]) -> dict[str, str]:
        """``EventLog.context``: ``trace_id``/``span_id`` for the event's line, or nothing."""
        if self._closed:
            return {}
        spec = FROM_EVENTS.get(kind)
        if spec is not None:
            try:  # a checkpoint's event, maybe on the store's thread: tracing must not fail it
                return _ids(self._span_of_event(spec, kind, fields))
            except Exception as exc:
                log.warning("tracing: no span for %s (%s: %s)", kind, type(exc).__name__, exc)
                return {}
        if threading.get_ident() != self._thread:
            return {}  # a background thread's event: no training span is its context
        current = self._open[-1] if self._open else (self._step if self._in_step else None)
        return _ids(current.get_span_context()) if current is not None else {}

    def _span_of_event(self, spec: _FromEvent, kind: str, fields: dict[str, Any]) -> SpanContext:
        end = time.time_ns()
        step = int(fields.get("step") or 0)
        if kind == "checkpoint_committed":
            self._commits[step] = end
        run, attempt, rank = self.who.run, self.who.attempt, self.who.rank
        trace_id = step_trace_id(run, attempt, step)
        ours = self.traced(step) and self._ran[0] <= step <= self._ran[1]  # its step span exists
        parent = _context(trace_id, step_span_id(run, attempt, step, rank), False) if ours else Context()
        attributes = self._base(step)
        for key, value in fields.items():
            if key != "step" and isinstance(value, str | bool | int | float):  # sent off the machine
                attributes[f"hpcpipe.checkpoint.{key}"] = (
                    hide_credentials(value)[:500] if isinstance(value, str) else value
                )
        span = self.tracing.start_span(
            spec.name, parent, attributes, trace_id=None if ours else trace_id,
            start_ns=self._start_ns(spec, step, fields, end),
        )  # fmt: skip
        if spec.error:
            why = hide_credentials(str(fields.get("error") or fields.get("reason") or kind))[:300]
            span.set_status(Status(StatusCode.ERROR, why))
        span.end(end_time=end)
        return span.get_span_context()

    def _start_ns(self, spec: _FromEvent, step: int, fields: dict[str, Any], end: int) -> int:
        seconds = fields.get(spec.seconds) if spec.seconds else None
        if isinstance(seconds, int | float):
            return end - int(seconds * 1e9)
        if spec.name == "checkpoint.verify":
            return min(self._commits.get(step, end), end)  # queued at the commit
        return end

    # -- the exporter's report, and the end ------------------------------------------------------

    def _unreachable(self, why: str) -> None:
        """Once per process, from the exporter's thread (its warning line is rank 0's only)."""
        fields = {"endpoint": self.endpoint, "reason": why, "rank": self.who.rank}
        self.events.emit("tracing_unreachable", fields)

    def close(self) -> None:
        """Send what is queued (within ``export_timeout_s``) and say what was lost."""
        if self._closed:
            return
        self._closed = True
        if self.events.context == self.event_context:
            self.events.context = None
        counts = otel_export.release(self.tracing)  # the last batch may be the first to fail: reported
        with contextlib.suppress(ValueError):
            self.tracing.exporter.on_unreachable.remove(self._unreachable)
        self.events.emit("tracing_closed", {**counts.to_event(), "rank": self.who.rank})
        lost = counts.failed + counts.dropped
        if lost and self.who.rank == 0 and not self.tracing.exporter.reported:
            log.warning(
                "tracing: %d of %d spans not sent (%d refused by %s, %d dropped: queue full or out of "
                "time at the end)", lost, counts.spans, counts.failed, self.endpoint, counts.dropped,
            )  # fmt: skip
