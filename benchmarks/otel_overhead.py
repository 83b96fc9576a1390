"""Training throughput with OpenTelemetry tracing on vs off, side by side in one run.

Two gloo ranks (``--nproc``) each build two Trainers on the same GPT and the same in-memory
tokens: "on" sends spans (every ``--sample-every``-th step with its phases and regions, and the
checkpoints' spans when there are any) over OTLP/HTTP to a collector; "off" has
``observe.otel.endpoint`` null. Both log every ``--log-every`` steps. ``--collector receiver``
(default) is a local OTLP/HTTP endpoint started here, in the parent process, that answers 200
and keeps the request bodies (they are decoded once timing is over, to count the spans that
arrived); ``--collector closed`` is a port where nothing listens (the exporter gives up at once
and drops, counted). Timed blocks alternate (on, off, off, on, ...) so drift on a shared machine
hits both; the ratio of median tokens/s is the result (target >= 0.98), printed with the median
of the ratios of adjacent on/off blocks (drift cancels within a pair). On a shared machine the
spread between blocks is larger than the cost, so the script also measures the cost directly:
the tracer's work at the loop's boundaries (the trainer's phase calls, no compute), with and
without it, in microseconds per step and as a share of the measured step.

    .venv/bin/python benchmarks/otel_overhead.py [--collector closed] [--repeats 11] [--sample-every 1]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch

from ddp_harness import finish, ranks_fork_from_here, spawn
from harness import Comparison, emit, parse_with_smoke, print_table
from hpcpipe.config.observe import OtelConfig
from hpcpipe.netutil import free_port
from hpcpipe.observe.metrics import EventLog, read_events
from hpcpipe.observe.otel import step_tracer
from hpcpipe.observe.phases import PhaseTimer
from observer_pair import PAIR_TOY, QUIET, ObserverPair, describe, pair_parser


class Collector:
    """An OTLP/HTTP endpoint on 127.0.0.1 that answers at once and keeps the bodies for later."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        bodies = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                bodies.append(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def spans(self) -> int:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        count = 0
        for body in self.bodies:
            request = ExportTraceServiceRequest.FromString(body)
            count += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        return count


PHASES = ("data", "forward", "comm", "backward", "optimizer")


def boundaries(timer: PhaseTimer, steps: int, log_every: int) -> float:
    """The trainer's calls to its phase timer for ``steps`` steps, without the compute: seconds."""
    start = time.perf_counter()
    for step in range(1, steps + 1):
        timer.begin_step(step)
        for phase in PHASES:
            timer.begin(phase)
        timer.end_step()
        if step % log_every == 0:
            with timer.region("all_reduce_metrics"):
                pass
    return time.perf_counter() - start


def listener_cost(args: argparse.Namespace, endpoint: str, repeats: int = 7) -> float:
    """Microseconds per step the tracer adds at the loop's boundaries (span creation included,
    sampling as configured), measured directly: the same ``args.direct_steps`` steps' calls with and
    without it, ``repeats`` times."""
    steps = args.direct_steps
    with tempfile.TemporaryDirectory() as tmp:
        cfg = OtelConfig(endpoint=endpoint, sample_every_steps=args.sample_every)
        tracer = step_tracer(cfg, "bench", 0, args.nproc, "host", EventLog(Path(tmp), enabled=False))
        assert tracer is not None
        bare, traced = PhaseTimer(torch.device("cpu")), PhaseTimer(torch.device("cpu"))
        traced.listeners.append(tracer)
        costs = []
        for _ in range(repeats):
            plain = boundaries(bare, steps, args.log_every)
            costs.append((boundaries(traced, steps, args.log_every) - plain) / steps)
        tracer.close()
    return statistics.median(costs) * 1e6


def worker(rank: int, args: argparse.Namespace, port: int, endpoint: str, out: Path) -> None:
    tracing = [f"observe.otel.endpoint={endpoint}", f"observe.otel.sample_every_steps={args.sample_every}"]
    pair = ObserverPair(rank, args, port, out, [*QUIET, *tracing], QUIET)
    result: dict[str, Any] = {**pair.time(), "tokens_per_step": pair.tokens_per_step}
    pair.close()
    if rank == 0:
        (closed,) = [e for e in read_events(out / "on" / "run") if e["event"] == "tracing_closed"]
        result["tracing"] = {key: closed[key] for key in ("spans", "sent", "failed", "dropped")}
    finish(rank, result, out)


def main() -> None:
    parser = pair_parser(__doc__)
    parser.add_argument("--collector", choices=("receiver", "closed"), default="receiver")
    parser.add_argument("--sample-every", type=int, default=10, help="observe.otel.sample_every_steps")
    parser.add_argument("--direct-steps", type=int, default=2000, help="steps of the direct measure")
    args = parse_with_smoke(parser, {**PAIR_TOY, "sample_every": 1, "direct_steps": 20})
    ranks_fork_from_here()  # before the collector's thread starts

    collector = Collector()
    collector.thread.start()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connects are refused, nobody takes it
    endpoint = (
        collector.endpoint if args.collector == "receiver" else f"http://127.0.0.1:{closed.getsockname()[1]}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        result = spawn(worker, (args, free_port(), endpoint, out), args.nproc, out)
    received = collector.spans()
    direct_us = listener_cost(args, endpoint)
    collector.server.shutdown()
    closed.close()
    report(args, result, received, direct_us)


def report(args: argparse.Namespace, result: dict[str, Any], received: int, direct_us: float) -> None:
    runs = {"on": result["on"], "off": result["off"]}
    comparison = Comparison.of(runs, "on", "off")
    step_ms = 1000 * result["tokens_per_step"] / comparison.bottom_median  # a step without tracing
    print(f"{describe(args)}; a trace every {args.sample_every} steps, to {args.collector}")
    print_table("tracing", "tok/s", runs)
    print(f"otel: {comparison.summary(0.98)}")
    print(
        f"direct: the tracer adds {direct_us:.1f} us per step at the loop's boundaries "
        f"({100 * direct_us / 1000 / step_ms:.3f}% of the {step_ms:.0f} ms step)"
    )
    tracing = result["tracing"]
    print(f"rank 0's spans: {tracing['spans']} ended, {tracing['sent']} sent, {tracing['failed']} failed, "
          f"{tracing['dropped']} dropped; the collector received {received} (both ranks)")  # fmt: skip
    emit(
        {
            "benchmark": "otel_overhead",
            "collector": args.collector,
            **comparison.fields("tokens_per_s"),
            "target": 0.98,
            "direct_us_per_step": round(direct_us, 2),
            "step_ms": round(step_ms, 2),
            "repeats": args.repeats,
            "steps_per_block": args.steps,
            "log_every": args.log_every,
            "sample_every_steps": args.sample_every,
            "nproc": args.nproc,
            "spans_received": received,
            "rank0_spans": tracing,
        }
    )


if __name__ == "__main__":
    main()
