"""Measure what a thresholds file asks for: one worker launch for the group benchmarks, then jobs.

Connectivity, collectives and compute share one launch of the benchmark workers (one process
group, started once); training throughput and scaling are real training runs of the preset. A
section that fails is recorded as ``{"error": ...}`` and the suite goes on, so one broken part
(a crashed rank, a preset that does not fit in memory) still leaves a complete report whose
failing rows say what happened.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpcpipe.accept.thresholds import Thresholds
from hpcpipe.errors import UserError


def bench_tasks(th: Thresholds) -> dict[str, dict[str, Any]]:
    """The worker tasks (connectivity, collectives, compute) the thresholds need."""
    from hpcpipe.bench.bus import parse_size
    from hpcpipe.bench.collectives import CollectiveSpec
    from hpcpipe.bench.compute import ComputeSpec

    tasks: dict[str, dict[str, Any]] = {}
    if th.connectivity is not None:
        tasks["connectivity"] = {}
    if th.collectives is not None:
        sizes = sorted({parse_size(str(s)) for table in th.collectives.busbw_gbps.values() for s in table})
        spec = CollectiveSpec.build(
            list(th.collectives.busbw_gbps),
            sizes,
            th.collectives.dtype,
            th.collectives.warmup,
            th.collectives.iters,
            skip_unfit=True,  # a size beyond memory fails its own rows, not the whole launch
        )
        tasks["collectives"] = spec.to_dict()
    if th.compute is not None:
        dtypes: list[str] = list(th.compute.matmul_tflops) or ["fp32"]
        tasks["compute"] = ComputeSpec.build(dtypes, None, None, th.compute.min_time_s, 3).to_dict()
    return tasks


def measure(
    th: Thresholds, nproc: int | None, out_dir: Path, log: Callable[[str], None] = print
) -> dict[str, Any] | None:
    """Every section's measurements on rank 0; None on the other ranks of an external launch.

    ``nproc`` (the command line's --nproc) overrides the file's rank counts, the top-level one and
    the throughput section's; scaling keeps its own list of world sizes.
    """
    from hpcpipe.bench.runner import (
        BenchFailure,
        BenchRefused,
        is_main_process,
        prestart_bench_server,
        run_bench,
    )

    measurements: dict[str, Any] = {}
    tasks = bench_tasks(th)
    prestart_bench_server(most_local_ranks(th, nproc, bool(tasks)), _training_preload(th))
    if tasks:
        log(f"accept: {', '.join(tasks)} on {nproc or th.nproc} rank(s)")
        try:
            result = run_bench(tasks, nproc or th.nproc, th.backend, th.timeout_s)
        except (BenchFailure, BenchRefused) as exc:  # the tasks that finished before it are kept
            result = {
                **exc.partial,
                **{name: {"error": str(exc)} for name in tasks if name not in exc.partial},
            }
        except RuntimeError as exc:
            result = {name: {"error": f"{type(exc).__name__}: {exc}"} for name in tasks}
        except UserError as exc:  # refused before any task ran: the rows fail, the report is still written
            result = {name: {"error": str(exc)} for name in tasks}
        measurements.update(result or {})
    if th.throughput is not None:
        log(f"accept: training throughput of {th.throughput.preset}")
        measurements["throughput"] = _guarded(lambda: _throughput(th, nproc, out_dir))
    if th.scaling is not None:
        log(f"accept: {th.scaling.mode} scaling of {th.scaling.preset} over N = {th.scaling.nproc}")
        measurements["scaling"] = _guarded(lambda: _scaling(th, out_dir))
    return measurements if is_main_process() else None


def most_local_ranks(th: Thresholds, nproc: int | None, benchmarks: bool) -> int:
    """The most ranks any section will start on this node: the benchmark workers (when there are
    ``benchmarks``), the throughput runs, the scaling runs' largest world size."""
    counts = [nproc or th.nproc] if benchmarks else []
    if th.throughput is not None:
        counts.append(nproc or th.throughput.nproc or th.nproc)
    if th.scaling is not None:
        counts.extend(th.scaling.nproc)
    return max(counts, default=1)


def _training_preload(th: Thresholds) -> tuple[str, ...]:
    """What the workers' server imports besides the benchmark worker when a section trains: the
    training worker and the trainer's stack (each run's recipe module its workers import)."""
    if th.throughput is None and th.scaling is None:
        return ()
    from hpcpipe.launch.job import WORKER_MODULE, WORKER_PRELOAD

    return (WORKER_MODULE, *WORKER_PRELOAD)


def _throughput(th: Thresholds, nproc: int | None, out_dir: Path) -> dict[str, Any] | None:
    from hpcpipe.bench.throughput import measure_throughput
    from hpcpipe.config import load_config

    section = th.throughput
    assert section is not None
    cfg = load_config(section.preset, section.set)
    return measure_throughput(
        cfg,
        section.steps,
        section.warmup,
        section.repeats,
        out_dir / "runs",
        nproc=nproc or section.nproc or th.nproc,
    )


def _scaling(th: Thresholds, out_dir: Path) -> dict[str, Any]:
    from hpcpipe.bench.scaling import run_scaling
    from hpcpipe.config import load_config
    from hpcpipe.report.plots_bench import plot_scaling

    section = th.scaling
    assert section is not None
    cfg = load_config(section.preset, section.set)
    # No accept row reads exposed communication: no no-sync twins (half the runs, and DeepSpeed
    # cannot train them).
    result = run_scaling(
        cfg, section.nproc, [section.mode], section.steps, section.warmup, out_dir / "runs", bottlenecks=False
    )
    result["png"] = str(plot_scaling(result["rows"], out_dir / "scaling.png"))
    return result


def _guarded(measure_section: Callable[[], dict[str, Any] | None]) -> dict[str, Any] | None:
    """A section's result, or ``{"error": ...}`` when its runs failed (the suite carries on)."""
    try:
        return measure_section()
    except (RuntimeError, UserError, OSError) as exc:
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
