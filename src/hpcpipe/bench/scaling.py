"""Strong and weak scaling of a recipe over world sizes N, with efficiencies, a CSV and a plot.

- strong scaling keeps the global batch fixed, so each of N ranks does 1/N of the work; ideal
  step time T(N) = T(1) / N and efficiency E_s(N) = T(1) / (N * T(N)).
- weak scaling keeps the per-rank batch fixed (the preset's global batch / its parallel.nproc),
  so the global batch grows with N; ideal T(N) = T(1) and E_w(N) = T(1) / T(N).

T is the median optimizer-step time of a benchmark run (``hpcpipe.bench.throughput``). When N = 1
is not in the list, the smallest N is the baseline: E_s = N0 T(N0) / (N T(N)), E_w = T(N0) / T(N).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from hpcpipe.bench.bottleneck import classify, exposed_communication
from hpcpipe.bench.throughput import bench_job, summarize_run
from hpcpipe.config import JobConfig
from hpcpipe.errors import UserError

MODES = ("strong", "weak")
CSV_COLUMNS = (
    "mode",
    "nproc",
    "nodes",
    "devices",
    "job_id",
    "global_batch_size",
    "micro_batch_size",
    "precision",
    "step_time_s",
    "per_s",
    "per_s_per_device",
    "time_per_epoch_s",
    "efficiency",
    "data_time_s",
    "step_time_nosync_s",
    "exposed_comm_s",
    "data_share",
    "comm_share",
    "bottleneck",
    "unit",
    "git_sha",
    "config_hash",
    "run_dir",
)


def batch_sizes(cfg: JobConfig, mode: str, nproc: int, where: str = "--nproc") -> tuple[int, int]:
    """(global, micro) batch for ``mode`` at ``nproc`` ranks; UserError when N does not divide it,
    naming ``where`` the world sizes came from (the flag, or a thresholds file's key)."""
    global_batch = cfg.train.global_batch_size
    if mode == "strong":
        if global_batch % nproc:
            raise UserError(
                f"{where} {nproc}: strong scaling splits train.global_batch_size ({global_batch}) "
                f"over the ranks; choose world sizes that divide it"
            )
        per_rank = global_batch // nproc
    elif mode == "weak":
        base = cfg.parallel.nproc
        if global_batch % base:
            raise UserError(
                f"weak scaling keeps train.global_batch_size / parallel.nproc per rank "
                f"({global_batch} / {base} is not whole)"
            )
        per_rank = global_batch // base
    else:
        raise UserError(f"--mode: unknown scaling mode {mode!r} (known: {', '.join(MODES)}, both)")
    micro = max(d for d in range(1, cfg.train.micro_batch_size + 1) if per_rank % d == 0)
    return per_rank * nproc, micro


def add_efficiency(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Set ``efficiency`` on every row, per mode, against that mode's smallest world size."""
    for mode in {row["mode"] for row in rows}:
        series = [row for row in rows if row["mode"] == mode]
        base = min(series, key=lambda row: row["nproc"])
        for row in series:
            if mode == "strong":
                row["efficiency"] = base["nproc"] * base["step_time_s"] / (row["nproc"] * row["step_time_s"])
            else:
                row["efficiency"] = base["step_time_s"] / row["step_time_s"]
    return rows


def run_scaling(
    cfg: JobConfig,
    nprocs: list[int],
    modes: list[str],
    steps: int,
    warmup: int,
    out_dir: Path,
    bottlenecks: bool = True,
) -> dict[str, Any]:
    """Train one benchmark run per (mode, N); returns rows with efficiencies (also in scaling.csv).

    With ``bottlenecks``, every N > 1 also trains its no-communication twin
    (``parallel.sync_gradients=false``) so each row carries its exposed communication time and a
    bottleneck verdict (``hpcpipe.bench.bottleneck``). A strategy that cannot skip gradient sync
    (DeepSpeed) trains no twins, and ``notes`` says so.
    """
    from hpcpipe.launch.job import run_job
    from hpcpipe.train.environment import detect_environment

    if detect_environment().is_external:
        raise UserError("bench scaling starts its own 1..N workers: run it without torchrun or srun")
    if not nprocs or any(n < 1 for n in nprocs):
        raise UserError("--nproc: give world sizes >= 1, e.g. --nproc 1,2,4")
    plans = [(mode, n, *batch_sizes(cfg, mode, n)) for mode in modes for n in sorted(set(nprocs))]
    # Decided before any run: the twin's config would be refused only after N=1 and N=2 trained.
    twins, notes = bottlenecks, []
    if bottlenecks and not cfg.parallel.can_skip_gradient_sync and max(nprocs) > 1:
        twins = False
        notes.append(
            f"exposed communication not measured: parallel.strategy={cfg.parallel.strategy} cannot "
            "skip gradient sync (parallel.sync_gradients=false), so the bottleneck verdicts leave "
            "communication out"
        )
    rows: list[dict[str, Any]] = []
    for mode, nproc, global_batch, micro in plans:
        name = f"{cfg.run.name}-scaling-{mode}-n{nproc}"
        job = bench_job(cfg, name, out_dir, steps, warmup, nproc, global_batch, micro)
        try:
            row = {"mode": mode, "nproc": nproc, **scaling_row(run_job(job), warmup)}
            nosync = None
            if twins and nproc > 1:
                twin = bench_job(
                    cfg, f"{name}-nosync", out_dir, steps, warmup, nproc, global_batch, micro, False
                )
                nosync = summarize_run(run_job(twin), warmup)["step_time_s"]
        except BaseException:
            if rows:  # the world sizes measured before the one that failed (an OOM at N=4) are kept
                write_csv(add_efficiency(rows), out_dir / "scaling.csv")
            raise
        rows.append(with_bottleneck(row, nosync))
    add_efficiency(rows)
    csv_path = write_csv(rows, out_dir / "scaling.csv")
    return {"name": cfg.run.name, "rows": rows, "csv": str(csv_path), "notes": notes}


def scaling_row(run_dir: Path, warmup: int) -> dict[str, Any]:
    """Step-time medians of a benchmark run plus the facts the study CSV carries."""
    from hpcpipe.observe.run_summary import summarize_run_dir

    summary = summarize_run(run_dir, warmup)
    facts = summarize_run_dir(run_dir, skip_rows=warmup)
    return {
        "nodes": facts["nodes"],
        "devices": facts["devices"],
        "job_id": facts["job_id"],
        "global_batch_size": facts["global_batch_size"],
        "micro_batch_size": facts["micro_batch_size"],
        "precision": facts["precision"],
        "step_time_s": summary["step_time_s"],
        "data_time_s": summary["data_time_s"],
        "per_s": summary["per_s"],
        "per_s_per_device": summary["per_s_per_device"],
        "time_per_epoch_s": facts["time_per_epoch_s"],
        "unit": summary["unit"],
        "git_sha": facts["git_sha"],
        "config_hash": facts["config_hash"],
        "run_dir": summary["run_dir"],
    }


def with_bottleneck(row: dict[str, Any], step_time_nosync_s: float | None) -> dict[str, Any]:
    """Add the data-wait and exposed-communication shares and the verdict to a row."""
    step, data = row["step_time_s"], row["data_time_s"]
    exposed = exposed_communication(step, step_time_nosync_s)
    row.update(
        step_time_nosync_s=step_time_nosync_s,
        exposed_comm_s=exposed,
        data_share=data / step,
        comm_share=None if exposed is None else exposed / step,
        bottleneck=classify(step, data, exposed),
    )
    return row


def write_csv(rows: list[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def parse_nprocs(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; a UserError naming --nproc otherwise."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise UserError(f"--nproc: expected a comma-separated list of world sizes like 1,2,4, got {text!r}")
    return sorted(set(values))
