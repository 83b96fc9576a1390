"""The OpenTelemetry SDK behind hpcpipe's spans: one provider per process, a bounded queue, an
exporter that gives up at once on an unreachable collector, and every lost span counted.

Imported only when ``observe.otel.endpoint`` is set (``otel.py``, ``pipeline/tracing.py``).

- **One provider per process**, shared by its users (``acquire``/``release``): ``hpcpipe run``
  with in-process training has the pipeline's spans and the trainer's in one queue. The last
  ``release`` shuts it down; every ``release`` sends what is queued, within ``export_timeout_s``.
  Only the last may stop the exporter when that time runs out; any other stops waiting and
  leaves it sending for the users still there.
- **Never raises.** A collector's failure (or the SDK's) is counted and reported, never raised
  into the loop or the pipeline: not from ending a span, an export, ``release`` or its callbacks.
- **Never blocks the loop.** Ending a span appends it to the SDK's ``BatchSpanProcessor`` queue
  (bounded by ``queue_size``; when full the oldest span is dropped); a background thread sends
  batches. The training thread never waits on the network.
- **An unreachable collector costs nothing.** Before the first batch (and after a failure) a TCP
  connect checks that the collector listens, so a closed port fails in microseconds instead of
  the SDK's retries with back-off; after a failure batches are dropped unsent for
  ``RETRY_AFTER_S``, then one is tried again. The first failure is reported once: one warning
  line (rank 0) and the ``on_unreachable`` callbacks (the trainer's ``tracing_unreachable``
  event). The SDK's own warnings about it are kept off stderr (``_quiet_sdk_logs``).
- **Counted:** spans ended, sent, failed (refused, or dropped while the collector was down), and
  dropped (queue overflow, or still queued when the time to send them ran out).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import Tracer

import hpcpipe
from hpcpipe.config.observe import OtelConfig
from hpcpipe.errors import hide_credentials, one_line

log = logging.getLogger("hpcpipe.observe")

RETRY_AFTER_S = 30.0  # after a failed export, batches are dropped (counted) this long before a retry
_PROBE_TIMEOUT_S = 1.0


class PresetIds(IdGenerator):
    """Random ids, except the ones ``preset`` names for the next span started on this thread:
    the derived ids of ``otel_ids.py`` (step spans, the pipeline's announced spans)."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self._next = threading.local()

    @contextlib.contextmanager
    def preset(self, trace_id: int | None, span_id: int | None) -> Iterator[None]:
        self._next.trace_id, self._next.span_id = trace_id, span_id
        try:
            yield
        finally:
            self._next.trace_id = self._next.span_id = None

    def generate_trace_id(self) -> int:
        preset: int | None = getattr(self._next, "trace_id", None)
        return preset if preset else self._random.generate_trace_id()

    def generate_span_id(self) -> int:
        preset: int | None = getattr(self._next, "span_id", None)
        return preset if preset else self._random.generate_span_id()

    def is_trace_id_random(self) -> bool:
        return False  # step traces are derived, not random (W3C's random-trace-id flag)


@dataclass(frozen=True)
class Counts:
    spans: int  # ended, handed to the queue
    sent: int  # accepted by the collector
    failed: int  # refused by it, or dropped unsent while it was unreachable
    dropped: int  # never handed to the exporter: queue overflow, or still queued at the end

    def to_event(self) -> dict[str, int]:
        return {"spans": self.spans, "sent": self.sent, "failed": self.failed, "dropped": self.dropped}


class _CountedBatches(BatchSpanProcessor):
    """The SDK's batch processor, counting what enters its queue."""

    def __init__(self, exporter: SpanExporter, **kwargs: Any) -> None:
        super().__init__(exporter, **kwargs)
        self.ended = 0
        self._lock = threading.Lock()

    def on_end(self, span: ReadableSpan) -> None:
        with self._lock:  # spans end on the training thread and on background threads
            self.ended += 1
        try:  # ending a span must never fail the loop: a span not queued is counted as dropped
            super().on_end(span)
        except Exception as exc:
            log.debug("tracing: a span was not queued (%s: %s)", type(exc).__name__, exc)


class _GuardedExporter(SpanExporter):
    """An OTLP exporter that checks the collector listens before trusting it, gives up on it for
    ``RETRY_AFTER_S`` after a failure, reports the first failure once, and counts."""

    def __init__(self, inner: SpanExporter, url: str, loud: bool, sdk_log: _LastMessage) -> None:
        self.inner, self.url, self.loud, self.sdk_log = inner, url, loud, sdk_log
        self.on_unreachable: list[Callable[[str], None]] = []
        self.sent = self.failed = 0
        self._known_good = False
        self._down_until = 0.0
        self.reported = False  # the first failure was reported (once per process)
        self._closed = False
        self._inner_shut = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed or time.monotonic() < self._down_until:
            self.failed += len(spans)
            return SpanExportResult.FAILURE
        try:
            why = None if self._known_good else _unreachable(self.url)
            if why is None:
                self.sdk_log.last = None
                if self.inner.export(spans) is SpanExportResult.SUCCESS:
                    self.sent += len(spans)
                    self._known_good = True
                    return SpanExportResult.SUCCESS
                why = self.sdk_log.last or "the collector did not accept the spans"
        except Exception as exc:  # the SDK's exporter, or the probe: a failed batch, not a crash
            why = f"{type(exc).__name__}: {exc}"
        self.failed += len(spans)
        self._known_good = False
        self._down_until = time.monotonic() + RETRY_AFTER_S
        self._report(why)
        return SpanExportResult.FAILURE

    def _report(self, why: str) -> None:
        if self.reported:
            return
        self.reported = True
        why = hide_credentials(one_line(why))[:300]
        if self.loud:
            log.warning(
                "tracing: spans cannot reach %s (%s); they are dropped and counted, training goes on",
                self.url,
                why,
            )
        for callback in list(self.on_unreachable):
            try:
                callback(why)
            except Exception as exc:  # one user's report (an event) failing is not the others'
                log.debug("tracing: a failure report failed (%s: %s)", type(exc).__name__, exc)

    def close(self) -> None:
        """Stop sending: later batches are dropped (counted); an export retrying is interrupted."""
        self._closed = True
        self.shutdown()

    def shutdown(self) -> None:
        if not self._inner_shut:
            self._inner_shut = True
            try:
                self.inner.shutdown()
            except Exception as exc:  # closing a session or channel to a collector in trouble
                log.debug("tracing: the exporter's shutdown failed (%s: %s)", type(exc).__name__, exc)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _unreachable(url: str) -> str | None:
    """Why nothing listens at ``url``'s host and port (a TCP connect), or None when something does
    or a proxy stands between (then only the export itself can tell)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if urllib.request.getproxies() and not urllib.request.proxy_bypass(host):
        return None
    try:
        socket.create_connection((host, port), timeout=_PROBE_TIMEOUT_S).close()
    except OSError as exc:
        return f"cannot connect to {host}:{port}: {exc.strerror or exc}"
    return None


class _LastMessage(logging.Handler):
    """Keeps the SDK exporter's last warning (the reason an export failed) off stderr: the
    failure is reported once, by ``_GuardedExporter``, and not at every retry."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.last = record.getMessage()


def _quiet_sdk_logs() -> _LastMessage:
    handler = _LastMessage()
    # The exporters (HTTP and gRPC) log each failed attempt; the batch processor each span it
    # drops from a full queue. Both are counted here instead.
    for name in ("opentelemetry.exporter.otlp", "opentelemetry.sdk._shared_internal"):
        logger = logging.getLogger(name)
        logger.handlers = [h for h in logger.handlers if not isinstance(h, _LastMessage)] + [handler]
        logger.propagate = False
    return handler


def _otlp_exporter(cfg: OtelConfig, url: str) -> SpanExporter:
    """The OTLP exporter for ``cfg.protocol``; headers come from OTEL_EXPORTER_OTLP_HEADERS."""
    if cfg.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

        return Grpc(endpoint=url, insecure=url.startswith("http://"), timeout=cfg.export_timeout_s)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

    return Http(endpoint=url, timeout=cfg.export_timeout_s)


def resource_attributes(cfg: OtelConfig, run: str, rank: int, host: str) -> dict[str, str | int]:
    """What every span of this process carries (OpenTelemetry names, ``hpcpipe.*`` otherwise)."""
    return {
        "service.name": cfg.service_name,
        "service.version": hpcpipe.__version__,
        "host.name": host,
        "process.pid": os.getpid(),
        "hpcpipe.run.id": run,
        "hpcpipe.rank": rank,
    }


@dataclass
class Tracing:
    """This process's provider and what its users need of it."""

    provider: TracerProvider
    tracer: Tracer
    ids: PresetIds
    processor: _CountedBatches
    exporter: _GuardedExporter
    timeout_s: float
    users: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def counts(self) -> Counts:
        sent, failed = self.exporter.sent, self.exporter.failed
        ended = self.processor.ended
        return Counts(ended, sent, failed, max(ended - sent - failed, 0))

    def start_span(
        self, name: str, parent: Any, attributes: dict[str, Any], trace_id: int | None = None,
        span_id: int | None = None, start_ns: int | None = None, links: Sequence[Any] = (),
    ) -> Span:  # fmt: skip
        """A span under ``parent`` (a context), with preset ids where given."""
        with self.ids.preset(trace_id, span_id):
            span = self.tracer.start_span(
                name, parent, attributes=attributes, links=links, start_time=start_ns
            )
        assert isinstance(span, Span)  # ALWAYS_ON: every span records
        return span


class _Process:
    """The one provider of this process, while it has users."""

    tracing: Tracing | None = None
    lock = threading.Lock()


def acquire(cfg: OtelConfig, attributes: dict[str, str | int], loud: bool) -> Tracing:
    """This process's provider (made on first use from ``cfg``; later users share it)."""
    with _Process.lock:
        if _Process.tracing is None:
            _Process.tracing = _make(cfg, attributes, loud)
        _Process.tracing.users += 1
        return _Process.tracing


def _make(cfg: OtelConfig, attributes: dict[str, str | int], loud: bool) -> Tracing:
    url = cfg.traces_url
    assert url is not None
    exporter = _GuardedExporter(_otlp_exporter(cfg, url), url, loud, _quiet_sdk_logs())
    processor = _CountedBatches(
        exporter,
        max_queue_size=cfg.queue_size,
        max_export_batch_size=min(512, cfg.queue_size),
        schedule_delay_millis=2000,
        export_timeout_millis=cfg.export_timeout_s * 1000,
    )
    ids = PresetIds()
    # Resource.create adds OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME; the job's values win.
    provider = TracerProvider(
        sampler=ALWAYS_ON, resource=Resource.create(attributes), id_generator=ids, shutdown_on_exit=False
    )
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("hpcpipe", hpcpipe.__version__)
    return Tracing(provider, tracer, ids, processor, exporter, cfg.export_timeout_s)


def release(tracing: Tracing) -> Counts:
    """Send what is queued (within ``export_timeout_s``); the last user also shuts the provider
    down. Returns the counts so far. Never raises.

    When the collector is too slow to take the queue in time, the last user stops the exporter
    (what is still queued is counted as dropped); any other user only stops waiting: the
    provider and its exporter are shared, and the users still there keep sending through them."""
    with _Process.lock:
        tracing.users -= 1
        last = tracing.users <= 0
        if last and _Process.tracing is tracing:
            _Process.tracing = None
    work = tracing.provider.shutdown if last else tracing.processor.force_flush
    if not _within(tracing.timeout_s, work) and last:
        tracing.exporter.close()
    return tracing.counts()


def _within(timeout_s: float, work: Callable[[], object]) -> bool:
    """Run ``work`` on a daemon thread; False when it did not finish within ``timeout_s`` (or
    could not run). What ``work`` raises is logged (debug), never raised."""

    def guarded() -> None:
        try:
            work()
        except Exception as exc:
            log.debug("tracing: sending the queue failed (%s: %s)", type(exc).__name__, exc)

    thread = threading.Thread(target=guarded, name="hpcpipe-otel-flush", daemon=True)
    try:
        thread.start()
    except RuntimeError:  # no new thread (interpreter shutting down): do not wait
        return False
    thread.join(timeout_s)
    return not thread.is_alive()
