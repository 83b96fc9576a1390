"""Training throughput with observers on vs off, side by side in one run.

``--observers telemetry`` (default): two gloo ranks (``--nproc``) each build two Trainers on the
same GPT and the same in-memory tokens: "on" serves a Prometheus endpoint per rank (scraped by a
thread here every ``--scrape-s``, as a server would), samples the GPU through NVML (a no-op, said
once, without one), and runs the imbalance all-gather at every logged step; "off" has the
exporter, NVML and the imbalance check switched off. Both log every ``--log-every`` steps, and
both keep the phase timers, which are always on (their cost is inside
`benchmarks/trainer_overhead.py`'s ratio against a hand-written loop). Timed blocks alternate (on,
off, off, on, ...) so drift on a shared machine hits both; the ratio of median tokens/s is the
result (target >= 0.97).

``--observers tracking``: "on" writes TensorBoard event files and logs to MLflow (a SQLite store
in the temporary directory, written by the sink's background thread in the training process,
so its CPU competes with training on a small machine); "off" has neither (target >= 0.98).

    .venv/bin/python benchmarks/observability_overhead.py [--observers tracking] [--repeats 11]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import urllib.request
from pathlib import Path

from ddp_harness import finish, ranks_fork_from_here, spawn
from harness import Comparison, emit, parse_with_smoke, print_table
from hpcpipe.netutil import free_port
from observer_pair import PAIR_TOY, QUIET, ObserverPair, describe, pair_parser


def on_sets(args: argparse.Namespace, metrics_port: int, out: Path) -> list[str]:
    """The observers under test: telemetry (the exporter, NVML, the imbalance check at every
    logged step) or tracking (TensorBoard and MLflow)."""
    if args.observers == "telemetry":
        return [
            f"observe.prometheus.port={metrics_port}",
            "observe.gpu.enabled=true",
            f"observe.imbalance.every_steps={args.log_every}",
            "observe.imbalance.warmup_steps=0",
        ]
    tracking = ["observe.tensorboard=true", f"observe.mlflow.tracking_uri=sqlite:///{out}/mlflow.db"]
    return [*QUIET, *tracking]


def scraper(port: int, every_s: float, stop: threading.Event) -> None:
    """What a Prometheus server does to the endpoint: GET /metrics every few seconds."""
    while not stop.wait(every_s):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()


def worker(rank: int, args: argparse.Namespace, port: int, metrics_port: int, out: Path) -> None:
    pair = ObserverPair(rank, args, port, out, on_sets(args, metrics_port, out), QUIET)
    stop = threading.Event()
    if args.observers == "telemetry":
        threading.Thread(target=scraper, args=(metrics_port + rank, args.scrape_s, stop), daemon=True).start()
    result = pair.time()
    stop.set()
    rows = (out / "on" / "run" / "metrics.jsonl").read_text().splitlines() if rank == 0 else []
    checks = sum(1 for line in rows if '"imbalance"' in line)
    pair.close()
    finish(rank, {**result, "imbalance_checks": checks}, out)


def main() -> None:
    parser = pair_parser(__doc__)
    parser.add_argument("--observers", choices=("telemetry", "tracking"), default="telemetry")
    parser.add_argument("--scrape-s", type=float, default=1.0, help="seconds between scrapes")
    args = parse_with_smoke(parser, {**PAIR_TOY, "scrape_s": 0.2})
    ranks_fork_from_here()

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        result = spawn(worker, (args, free_port(), free_port(), out), args.nproc, out)

    runs = {"on": result["on"], "off": result["off"]}
    comparison = Comparison.of(runs, "on", "off")
    target = 0.97 if args.observers == "telemetry" else 0.98
    print(f"{describe(args)}; scrape every {args.scrape_s} s")
    print_table("observers", "tok/s", runs)
    print(f"{args.observers}: {comparison.summary(target)}")
    print(f"imbalance all-gathers in the on-run: {result['imbalance_checks']}")
    fields = comparison.fields("tokens_per_s")
    emit(
        {
            "benchmark": "observability_overhead",
            "observers": args.observers,
            **fields,
            "target": target,
            "repeats": args.repeats,
            "steps_per_block": args.steps,
            "log_every": args.log_every,
            "nproc": args.nproc,
            "imbalance_checks": result["imbalance_checks"],
        }
    )


if __name__ == "__main__":
    main()
