"""all_reduce bus bandwidth measured through hpcpipe vs a raw torch.distributed timing loop.

Both run in the same worker processes, on the same group, at the same sizes and iteration counts.
hpcpipe's side is the library call the CLI makes (``run_collectives``: buffers, the result check,
warm-up, timed loop, per-rank gather); the raw side is the loop anyone would write
(``torch.ones``, warm-up, barrier, ``dist.all_reduce`` N times). Each is timed on every rank and
averaged over ranks, as nccl-tests does, then turned into busbw with the same 2(n-1)/n factor.
Measurements alternate (hpcpipe, raw, raw, hpcpipe, ...) so drift on a shared machine hits both;
the ratio of the medians over repeats is the result (target >= 0.95 at 4-64 MiB).

    .venv/bin/python benchmarks/collectives_overhead.py [--nproc 2] [--repeats 9] [--window-s 0.25]

Prints a table and, last, one JSON line with the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from functools import partial
from pathlib import Path
from typing import Any

from harness import Comparison, emit, parse_with_smoke, side_by_side

TARGET = 0.95
SIZES_MIB = (4, 8, 16, 32, 64)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nproc", type=int, default=2, help="ranks (gloo on CPU, NCCL on GPUs)")
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=list(SIZES_MIB))
    parser.add_argument("--repeats", type=int, default=9, help="alternating measurements per side and size")
    parser.add_argument(
        "--window-s", type=float, default=0.25, help="seconds per measurement; sets the iterations per size"
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls per measurement")
    parser.add_argument("--out", type=Path, default=None, help="(internal) where rank 0 writes its figures")
    # --smoke: one 1 MiB size, one round of ~10 ms per side, on the same ranks
    toy = {"sizes_mib": [1], "repeats": 1, "window_s": 0.01, "warmup": 1}
    return parse_with_smoke(parser, toy, argv)


def iterations_for(size: int, args: argparse.Namespace, device: Any) -> int:
    """Timed calls per measurement at ``size`` so one measurement lasts about ``--window-s``.

    Long windows average over the scheduler's time slices on a shared host; every rank uses the
    slowest rank's probe so all agree on the count.
    """
    import torch
    import torch.distributed as dist

    buf = torch.ones(size // 4, dtype=torch.float32, device=device)
    dist.all_reduce(buf)
    start = time.perf_counter()
    for _ in range(3):
        dist.all_reduce(buf)
    probe = torch.tensor([(time.perf_counter() - start) / 3], dtype=torch.float64, device=device)
    dist.all_reduce(probe, op=dist.ReduceOp.MAX)
    return max(5, min(500, round(args.window_s / float(probe.item()))))


def raw_busbw(size: int, iters: int, args: argparse.Namespace, device: Any, world: int) -> float | None:
    """The hand-written loop; rank 0 returns busbw in GB/s from the mean time over ranks."""
    import torch
    import torch.distributed as dist

    buf = torch.ones(size // 4, dtype=torch.float32, device=device)
    for _ in range(args.warmup):
        dist.all_reduce(buf)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = (time.perf_counter() - start) / iters
    times: list[Any] = [None] * world
    dist.all_gather_object(times, elapsed)
    if dist.get_rank() != 0:
        return None
    return size / statistics.fmean(times) * 2 * (world - 1) / world / 1e9


def hpcpipe_busbw(size: int, iters: int, args: argparse.Namespace, ctx: Any) -> float | None:
    from hpcpipe.bench.collectives import CollectiveSpec, run_collectives

    spec = CollectiveSpec.build(["all_reduce"], [size], "float32", args.warmup, iters)
    result = run_collectives(spec, ctx)
    return None if result is None else float(result["results"][0]["busbw_gbps"])


def worker(args: argparse.Namespace) -> None:
    """One rank: every size, ``repeats`` rounds of both sides, rotated."""
    from hpcpipe.bench.group import bench_group
    from hpcpipe.config import ParallelConfig
    from hpcpipe.train.environment import detect_environment

    with bench_group(ParallelConfig(timeout_s=300), detect_environment()) as ctx:
        figures: dict[str, dict[str, list[float]]] = {}
        iterations: dict[str, int] = {}
        for mib in args.sizes_mib:
            size = mib << 20
            iters = iterations_for(size, args, ctx.device)
            iterations[str(mib)] = iters
            sides = side_by_side(
                {
                    "hpcpipe": partial(hpcpipe_busbw, size, iters, args, ctx),
                    "raw": partial(raw_busbw, size, iters, args, ctx.device, ctx.world_size),
                },
                args.repeats,
            )
            # rank 0's figures: the other ranks measure alongside and get None
            figures[str(mib)] = {side: [v for v in values if v is not None] for side, values in sides.items()}
        if ctx.is_main and args.out is not None:
            run = {"world_size": ctx.world_size, "device": ctx.device.type, "iterations": iterations}
            args.out.write_text(json.dumps({**run, "figures": figures}))


def forked_main(*argv: str) -> None:
    """A rank forked from the elastic agent's fork server: the agent imports this module by name
    (benchmarks/ is on sys.path and PYTHONPATH) and calls this with the worker's arguments."""
    from hpcpipe.launch.exit import return_or_exit
    from hpcpipe.launch.fork_server import begin_forked_worker

    begin_forked_worker()
    try:
        worker(parse_args(list(argv)))
    except Exception:
        traceback.print_exc()
        return_or_exit(1)
    return_or_exit(0)


def report(data: dict[str, Any], args: argparse.Namespace) -> None:
    """Per size: the median of each side, their ratio (the figure), and the median paired ratio
    (each round's own hpcpipe/raw), which shows how much of a deviation is noise from other jobs
    on the machine."""
    print(
        f"all_reduce busbw, {data['world_size']} ranks on {data['device']}, "
        f"median of {args.repeats} alternating measurements of ~{args.window_s:g} s per side and size"
    )
    print(f"{'size':>8} {'iters':>6} {'hpcpipe GB/s':>13} {'raw GB/s':>10} {'ratio':>7} {'paired ratio':>13}")
    ratios, paired = {}, {}
    for mib, sides in data["figures"].items():
        c = Comparison.of(sides, "hpcpipe", "raw")
        ratios[f"{mib}MiB"], paired[f"{mib}MiB"] = c.ratio, c.paired
        iters = data["iterations"][mib]
        print(
            f"{mib + ' MiB':>8} {iters:>6} {c.top_median:>13.3f} {c.bottom_median:>10.3f} "
            f"{c.ratio:>7.3f} {c.paired:>13.3f}"
        )
    emit(
        {
            "benchmark": "collectives_overhead",
            "collective": "all_reduce",
            "world_size": data["world_size"],
            "ratios": {k: round(v, 4) for k, v in ratios.items()},
            "paired_ratios": {k: round(v, 4) for k, v in paired.items()},
            "min_ratio": round(min(ratios.values()), 4),
            "median_ratio": round(statistics.median(ratios.values()), 4),
            "target": TARGET,
            "device": data["device"],
        }
    )


def main() -> None:
    args = parse_args(sys.argv[1:])
    if "RANK" in os.environ:  # a rank started as a process of its own (torchrun, or spawn)
        worker(args)
        sys.stdout.flush()
        os._exit(0)  # gloo can abort at interpreter exit after destroy_process_group
    from hpcpipe.launch.local import launch_local

    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        worker_args = [*sys.argv[1:], "--out", str(out)]
        code = launch_local("collectives_overhead", worker_args, args.nproc)
        if code != 0 or not out.is_file():
            sys.exit(f"benchmark workers failed (exit code {code})")
        report(json.loads(out.read_text()), args)


if __name__ == "__main__":
    main()
