"""OpenTelemetry spans of ``hpcpipe run``: one root span, and one span per step under it.

A skipped step has its span too (``hpcpipe.pipeline.action`` = skip, and why); a step that ran
carries its status (done, not-applicable, failed). The trace continues a ``TRACEPARENT`` already
in the environment (a CI job's span), else it starts a new one.

**The training workers' link.** The train step's span id is fixed before the step starts
(``otel_ids.derived_span_id`` of the root span and the step's name) and written to ``TRACEPARENT``
when the trace begins: that is before the CLI forks its fork server, whose environment every
forked worker inherits (``launch/fork_server.py``), so it reaches them whatever the start method.
Rank 0's training-step spans link to it (``observe/otel_steps.py``).

Off (``observe.otel.endpoint`` null): ``pipeline_trace`` returns None, and nothing of
OpenTelemetry is imported.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from hpcpipe.config import JobConfig
from hpcpipe.errors import hide_credentials
from hpcpipe.observe.otel import require_otel
from hpcpipe.observe.otel_ids import (
    TRACEPARENT_VAR,
    derived_span_id,
    format_traceparent,
    parse_traceparent,
)
from hpcpipe.train.environment import node_name

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import Span

    from hpcpipe.observe.otel_export import Tracing

ANNOUNCED_STEP = "train"  # the step whose span the workers link to


class PipelineTrace:
    def __init__(self, job: JobConfig) -> None:
        self.cfg, self.run = job.observe.otel, job.run.name
        self.parent = parse_traceparent(os.environ.get(TRACEPARENT_VAR))
        self.trace_id = self.parent.trace_id if self.parent else secrets.randbits(128) or 1
        self.root_id = secrets.randbits(64) or 1
        self._tracing: Tracing | None = None  # while ``root`` runs
        self._root: Span | None = None

    def announce(self) -> None:
        """``TRACEPARENT`` = the train step's span, for the processes started from here on."""
        span_id = derived_span_id(self.root_id, ANNOUNCED_STEP)
        os.environ[TRACEPARENT_VAR] = format_traceparent(self.trace_id, span_id)

    @contextlib.contextmanager
    def root(self, steps: list[str]) -> Iterator[None]:
        """The pipeline's span, around the steps; the provider is sent and released after it."""
        from opentelemetry.context import Context
        from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

        from hpcpipe.observe import otel_export

        rank = int(os.environ.get("RANK", "0"))
        attributes = otel_export.resource_attributes(self.cfg, self.run, rank, node_name())
        self._tracing = otel_export.acquire(self.cfg, attributes, loud=rank == 0)
        parent = Context()
        if self.parent is not None:
            flags = TraceFlags(TraceFlags.SAMPLED)
            remote = SpanContext(self.parent.trace_id, self.parent.span_id, True, flags)
            parent = set_span_in_context(NonRecordingSpan(remote))
        span = self._tracing.start_span(
            "pipeline",
            parent,
            {"hpcpipe.run.id": self.run, "hpcpipe.pipeline.step_names": steps},
            trace_id=None if self.parent else self.trace_id,
            span_id=self.root_id,
        )
        self._root = span
        try:
            with _failing(span):
                yield
        finally:
            span.end()
            otel_export.release(self._tracing)

    @contextlib.contextmanager
    def step(self, name: str, action: str, reason: str) -> Iterator[Callable[[str], None]]:
        """A step's span (inside ``root``); call what it yields with the step's final status."""
        from opentelemetry.trace import set_span_in_context

        assert self._tracing is not None and self._root is not None, "a step span belongs inside root()"
        span = self._tracing.start_span(
            f"pipeline.{name}",
            set_span_in_context(self._root),
            {
                "hpcpipe.run.id": self.run,
                "hpcpipe.pipeline.action": action,
                "hpcpipe.pipeline.reason": hide_credentials(reason),
            },
            span_id=derived_span_id(self.root_id, name),
        )
        try:
            with _failing(span):
                yield lambda status: span.set_attribute("hpcpipe.pipeline.status", status)
        except BaseException:
            span.set_attribute("hpcpipe.pipeline.status", "failed")  # engine.FAILED
            raise
        finally:
            span.end()


@contextlib.contextmanager
def _failing(span: object) -> Iterator[None]:
    """Marks ``span`` failed when the block raises (a preemption too: the step did not finish).
    The message goes to the collector: credentials in it (a URL's ``user:password@``, a token)
    are taken out first."""
    from opentelemetry.trace import Span, Status, StatusCode

    assert isinstance(span, Span)
    try:
        yield
    except BaseException as exc:
        span.set_status(Status(StatusCode.ERROR, hide_credentials(f"{type(exc).__name__}: {exc}")[:300]))
        raise


def pipeline_trace(job: JobConfig) -> PipelineTrace | None:
    """The run's trace, announced in ``TRACEPARENT`` (call it before the fork server starts);
    None when tracing is off."""
    if job.observe.otel.endpoint is None:
        return None
    require_otel(job.observe.otel)
    trace = PipelineTrace(job)
    trace.announce()
    return trace


@contextlib.contextmanager
def root_span(trace: PipelineTrace | None, steps: list[str]) -> Iterator[None]:
    """``trace.root``, or nothing when not tracing."""
    if trace is None:
        yield
        return
    with trace.root(steps):
        yield


@contextlib.contextmanager
def step_span(
    trace: PipelineTrace | None, name: str, action: str, reason: str
) -> Iterator[Callable[[str], None]]:
    """``trace.step`` (what it yields takes the step's status), or nothing when not tracing."""
    if trace is None:
        yield lambda status: None
        return
    with trace.step(name, action, reason) as outcome:
        yield outcome
