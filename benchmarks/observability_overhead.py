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
import json
import os
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hpcpipe.config import load_config
from hpcpipe.netutil import free_port
from hpcpipe.train.distributed import init_distributed
from hpcpipe.train.environment import DistEnv
from hpcpipe.train.trainer import Trainer
from run_context import print_rates, run_context
from trainer_overhead import InMemoryGPTRecipe


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


def scraper(port: int, every_s: float, stop: threading.Event) -> None:
    """What a Prometheus server does to the endpoint: GET /metrics every few seconds."""
    while not stop.wait(every_s):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()


def timed(fn: Any, steps: int, tokens: int) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn(steps)
    dist.barrier()
    return tokens * steps / (time.perf_counter() - start)


def worker(rank: int, args: argparse.Namespace, port: int, metrics_port: int, out: Path) -> None:
    env = DistEnv("torchrun", rank, rank, args.nproc, args.nproc, "127.0.0.1", port)
    job = load_config("quickstart", [f"parallel.nproc={args.nproc}"])
    ctx = init_distributed(job.parallel, env)
    torch.manual_seed(0)
    tokens = torch.randint(0, args.vocab, (256, job.model.seq_len + 1))
    quiet = ["observe.gpu.enabled=false", "observe.imbalance.every_steps=0"]
    if args.observers == "telemetry":
        on = trainer(args, ctx, tokens, out / "on", [
            f"observe.prometheus.port={metrics_port}", "observe.gpu.enabled=true",
            f"observe.imbalance.every_steps={args.log_every}", "observe.imbalance.warmup_steps=0",
        ])  # fmt: skip
    else:
        tracking = ["observe.tensorboard=true", f"observe.mlflow.tracking_uri=sqlite:///{out}/mlflow.db"]
        on = trainer(args, ctx, tokens, out / "on", [*quiet, *tracking])
    off = trainer(args, ctx, tokens, out / "off", quiet)
    stop = threading.Event()
    if args.observers == "telemetry":
        threading.Thread(target=scraper, args=(metrics_port + rank, args.scrape_s, stop), daemon=True).start()
    tokens_per_step = args.batch * args.nproc * job.model.seq_len
    ours = {"on": lambda n: on.train_until(on.step + n), "off": lambda n: off.train_until(off.step + n)}
    ours["on"](args.log_every), ours["off"](args.log_every)  # warm-up
    result: dict[str, list[float]] = {"on": [], "off": []}
    for i in range(args.repeats):
        for name in ("on", "off") if i % 2 == 0 else ("off", "on"):
            result[name].append(timed(ours[name], args.steps, tokens_per_step))
    stop.set()
    rows = (out / "on" / "run" / "metrics.jsonl").read_text().splitlines() if rank == 0 else []
    checks = sum(1 for line in rows if '"imbalance"' in line)
    on.close()
    off.close()
    if rank == 0:
        (out / "result.json").write_text(json.dumps({**result, "imbalance_checks": checks}))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--observers", choices=("telemetry", "tracking"), default="telemetry")
    parser.add_argument("--nproc", type=int, default=2, help="DDP ranks (gloo on CPU)")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per timed block")
    parser.add_argument("--log-every", type=int, default=10, help="observe.log_every (and imbalance check)")
    parser.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--scrape-s", type=float, default=1.0, help="seconds between scrapes")
    args = parser.parse_args()

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        mp.start_processes(
            worker, args=(args, free_port(), free_port(), out), nprocs=args.nproc, start_method="spawn"
        )
        result = json.loads((out / "result.json").read_text())

    on, off = statistics.median(result["on"]), statistics.median(result["off"])
    print(
        f"{args.nproc} gloo ranks, quickstart GPT, {args.batch} seq/rank/step, {args.repeats} repeats x "
        f"{args.steps} steps, interleaved; log every {args.log_every}; scrape every {args.scrape_s} s"
    )
    print_rates("observers", "tok/s", {"on": result["on"], "off": result["off"]})
    target = 0.97 if args.observers == "telemetry" else 0.98
    print(f"{args.observers}: ratio on/off = {on / off:.3f} (target >= {target})")
    print(f"imbalance all-gathers in the on-run: {result['imbalance_checks']}")
    print(
        json.dumps(
            {
                "benchmark": "observability_overhead",
                "observers": args.observers,
                "on_tokens_per_s": round(on, 1),
                "off_tokens_per_s": round(off, 1),
                "ratio": round(on / off, 4),
                "repeats": args.repeats,
                "steps_per_block": args.steps,
                "log_every": args.log_every,
                "nproc": args.nproc,
                "imbalance_checks": result["imbalance_checks"],
                **run_context(),
            }
        )
    )


if __name__ == "__main__":
    main()
