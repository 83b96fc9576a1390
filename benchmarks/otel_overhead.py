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
import json
import os
import socket
import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hpcpipe.config import load_config
from hpcpipe.config.observe import OtelConfig
from hpcpipe.netutil import free_port
from hpcpipe.observe.metrics import EventLog, read_events
from hpcpipe.observe.otel import step_tracer
from hpcpipe.observe.phases import PhaseTimer
from hpcpipe.train.distributed import init_distributed
from hpcpipe.train.environment import DistEnv
from hpcpipe.train.trainer import Trainer
from run_context import print_rates, run_context
from trainer_overhead import InMemoryGPTRecipe


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


def trainer(
    args: argparse.Namespace, ctx: Any, tokens: torch.Tensor, out: Path, observers: list[str]
) -> Trainer:
    job = load_config(
        "quickstart",
        [
            f"train.steps={10**6}",
            "train.eval_every=0",
            f"parallel.nproc={args.nproc}",
            "observe.progress=false",
            "observe.gpu.enabled=false",
            "observe.imbalance.every_steps=0",
            f"observe.log_every={args.log_every}",
            f"train.micro_batch_size={args.batch}",
            f"train.global_batch_size={args.batch * args.nproc}",
            f"model.vocab_size={args.vocab}",
            f"run.out_dir={out}",
            *observers,
        ],
    )
    recipe = InMemoryGPTRecipe.from_job(job)
    recipe.tokens, recipe.fixed_vocab = tokens, args.vocab
    (out / "run").mkdir(parents=True, exist_ok=True)
    return Trainer(job, recipe, ctx, out / "run")


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


def listener_cost(args: argparse.Namespace, endpoint: str, steps: int = 2000, repeats: int = 7) -> float:
    """Microseconds per step the tracer adds at the loop's boundaries (span creation included,
    sampling as configured), measured directly: the same calls with and without it."""
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


def timed(fn: Any, steps: int, tokens: int) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn(steps)
    dist.barrier()
    return tokens * steps / (time.perf_counter() - start)


def worker(rank: int, args: argparse.Namespace, port: int, endpoint: str, out: Path) -> None:
    env = DistEnv("torchrun", rank, rank, args.nproc, args.nproc, "127.0.0.1", port)
    job = load_config("quickstart", [f"parallel.nproc={args.nproc}"])
    ctx = init_distributed(job.parallel, env)
    torch.manual_seed(0)
    tokens = torch.randint(0, args.vocab, (256, job.model.seq_len + 1))
    tracing = [f"observe.otel.endpoint={endpoint}", f"observe.otel.sample_every_steps={args.sample_every}"]
    on = trainer(args, ctx, tokens, out / "on", tracing)
    off = trainer(args, ctx, tokens, out / "off", [])
    tokens_per_step = args.batch * args.nproc * job.model.seq_len
    ours = {"on": lambda n: on.train_until(on.step + n), "off": lambda n: off.train_until(off.step + n)}
    ours["on"](args.log_every), ours["off"](args.log_every)  # warm-up
    result: dict[str, list[float]] = {"on": [], "off": []}
    for i in range(args.repeats):
        for name in ("on", "off") if i % 2 == 0 else ("off", "on"):
            result[name].append(timed(ours[name], args.steps, tokens_per_step))
    on.close()
    off.close()
    if rank == 0:
        (closed,) = [e for e in read_events(out / "on" / "run") if e["event"] == "tracing_closed"]
        counts = {key: closed[key] for key in ("spans", "sent", "failed", "dropped")}
        summary = {**result, "tracing": counts, "tokens_per_step": tokens_per_step}
        (out / "result.json").write_text(json.dumps(summary))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--collector", choices=("receiver", "closed"), default="receiver")
    parser.add_argument("--nproc", type=int, default=2, help="DDP ranks (gloo on CPU)")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per timed block")
    parser.add_argument("--log-every", type=int, default=10, help="observe.log_every")
    parser.add_argument("--sample-every", type=int, default=10, help="observe.otel.sample_every_steps")
    parser.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    parser.add_argument("--vocab", type=int, default=4096)
    args = parser.parse_args()

    import torch.multiprocessing as mp

    collector = Collector()
    collector.thread.start()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connects are refused, nobody takes it
    endpoint = (
        collector.endpoint if args.collector == "receiver" else f"http://127.0.0.1:{closed.getsockname()[1]}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        mp.start_processes(
            worker, args=(args, free_port(), endpoint, out), nprocs=args.nproc, start_method="spawn"
        )
        result = json.loads((out / "result.json").read_text())
    received = collector.spans()
    direct_us = listener_cost(args, endpoint)
    collector.server.shutdown()
    closed.close()

    on, off = statistics.median(result["on"]), statistics.median(result["off"])
    step_ms = 1000 * result["tokens_per_step"] / off  # a step without tracing
    # Each on block next to its off block: drift over the run cancels within a pair.
    paired = statistics.median(a / b for a, b in zip(result["on"], result["off"], strict=True))
    print(
        f"{args.nproc} gloo ranks, quickstart GPT, {args.batch} seq/rank/step, {args.repeats} repeats x "
        f"{args.steps} steps, interleaved; log every {args.log_every}; a trace every {args.sample_every} "
        f"steps, to {args.collector}"
    )
    print_rates("tracing", "tok/s", {"on": result["on"], "off": result["off"]})
    print(f"otel: ratio on/off = {on / off:.3f} (target >= 0.98); median of paired blocks {paired:.3f}")
    print(
        f"direct: the tracer adds {direct_us:.1f} us per step at the loop's boundaries "
        f"({100 * direct_us / 1000 / step_ms:.3f}% of the {step_ms:.0f} ms step)"
    )
    tracing = result["tracing"]
    print(f"rank 0's spans: {tracing['spans']} ended, {tracing['sent']} sent, {tracing['failed']} failed, "
          f"{tracing['dropped']} dropped; the collector received {received} (both ranks)")  # fmt: skip
    print(
        json.dumps(
            {
                "benchmark": "otel_overhead",
                "collector": args.collector,
                "on_tokens_per_s": round(on, 1),
                "off_tokens_per_s": round(off, 1),
                "ratio": round(on / off, 4),
                "paired_ratio": round(paired, 4),
                "direct_us_per_step": round(direct_us, 2),
                "step_ms": round(step_ms, 2),
                "repeats": args.repeats,
                "steps_per_block": args.steps,
                "log_every": args.log_every,
                "sample_every_steps": args.sample_every,
                "nproc": args.nproc,
                "spans_received": received,
                "rank0_spans": tracing,
                **run_context(),
            }
        )
    )


if __name__ == "__main__":
    main()
