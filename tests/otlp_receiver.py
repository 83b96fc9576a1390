"""A real OTLP/HTTP trace receiver for tests: ``POST /v1/traces`` on 127.0.0.1, each request
decoded as an ``ExportTraceServiceRequest`` (opentelemetry-proto), every span kept with its ids,
parent, links and attributes (the resource's merged under the span's own)."""

from __future__ import annotations

import contextlib
import gzip
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

TRACES_PATH = "/v1/traces"


@dataclass(frozen=True)
class Received:
    name: str
    trace_id: str  # lowercase hex, as in events.jsonl
    span_id: str
    parent_id: str  # "" for a root span
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    links: list[tuple[str, str]]  # (trace_id, span_id) of each link
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(pairs: list[KeyValue]) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def decode(body: bytes) -> list[Received]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(list(resource_spans.resource.attributes))
        for scope in resource_spans.scope_spans:
            for span in scope.spans:
                spans.append(
                    Received(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes={**resource, **_attributes(list(span.attributes))},
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                        status_code=span.status.code,
                        status_message=span.status.message,
                    )
                )
    return spans


@contextlib.contextmanager
def closed_port() -> Iterator[str]:
    """An endpoint where nothing listens, for as long as the block runs: the port is bound and
    never listened on, so a connect is refused and no other process (a rendezvous store binding
    port 0) can take it meanwhile, as it could a port merely found free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@dataclass
class OtlpReceiver:
    """``with OtlpReceiver() as receiver:`` serves ``receiver.endpoint`` until the block ends;
    ``delay_s`` holds every request that long first (a slow collector)."""

    delay_s: float = 0.0
    spans: list[Received] = field(default_factory=list)
    requests: int = 0
    headers: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def received(self) -> list[Received]:
        with self._lock:
            return list(self.spans)

    def wait_for(self, count: int, timeout_s: float = 10.0) -> list[Received]:
        deadline = time.monotonic() + timeout_s
        while len(self.received()) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.received()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if receiver.delay_s:
                    time.sleep(receiver.delay_s)
                if self.path != TRACES_PATH:
                    self.send_error(404)
                    return
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                spans = decode(body)
                with receiver._lock:
                    receiver.spans.extend(spans)
                    receiver.requests += 1
                    receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:  # quiet test output
                pass

        return Handler
