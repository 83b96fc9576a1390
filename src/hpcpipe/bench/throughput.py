"""Training throughput of a recipe: short runs of the real trainer, read back from metrics.jsonl.

A benchmark run is the job itself with a metrics row every step (``observe.log_every=1``) and
``warmup + steps`` optimizer steps; the first ``warmup`` rows (compilation, allocator growth, cold
caches, the first collectives) are dropped and the median of the remaining rows is the run's
figure. With ``repeats`` runs the median of the runs' figures is reported, so one noisy run (a
neighbour on a shared node) does not decide the result. Going through the trainer and its run
directory, rather than a separate timing loop, means the figure is the one a real job gets.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from hpcpipe.config import JobConfig, validate_config
from hpcpipe.errors import UserError
from hpcpipe.layout import RunLayout


def bench_job(
    cfg: JobConfig,
    name: str,
    out_dir: Path,
    steps: int,
    warmup: int,
    nproc: int | None = None,
    global_batch_size: int | None = None,
    micro_batch_size: int | None = None,
    sync_gradients: bool = True,
) -> JobConfig:
    """``cfg`` turned into a benchmark run: every step logged, ``warmup + steps`` steps, no eval.

    ``sync_gradients=False`` is the same run without gradient all-reduces (the no-communication
    twin that exposes communication time).
    """
    if steps < 1 or warmup < 0:
        raise UserError("--steps must be >= 1 and --warmup >= 0")
    raw = cfg.to_dict()
    raw["run"].update(name=name, out_dir=str(out_dir))
    raw["observe"].update(log_every=1, progress=False)
    # eval_every 0 leaves only the final evaluation; one batch keeps it short (it is not timed).
    raw["train"].update(steps=warmup + steps, epochs=None, eval_every=0, eval_batches=1)
    raw["parallel"]["sync_gradients"] = sync_gradients
    # Measured fresh every time: a rerun in the same run directory resumed from the last run's
    # checkpoint, trained nothing and reported that run's rows again (and accept passed on them).
    raw["checkpoint"].update(every_steps=0, durable_dir=None, resume="never")
    if raw["data"]["format"] != "tokens":  # the final evaluation is not timed: keep it one batch
        raw["data"]["max_eval_samples"] = raw["train"]["micro_batch_size"]
    if global_batch_size is not None:
        raw["train"]["global_batch_size"] = global_batch_size
    if micro_batch_size is not None:
        raw["train"]["micro_batch_size"] = micro_batch_size
    if nproc is not None:
        raw["parallel"]["nproc"] = nproc
    return validate_config(raw, origin=f"benchmark job {name}")


def summarize_run(run_dir: Path, warmup: int) -> dict[str, Any]:
    """Medians over the training rows of ``run_dir/metrics.jsonl`` after ``warmup`` steps."""
    from hpcpipe.observe.metrics import read_metrics

    rows = [r for r in read_metrics(run_dir) if "loss" in r and int(r.get("step", 0)) > warmup]
    if not rows:
        raise RuntimeError(f"{RunLayout(run_dir).metrics}: no training rows after the {warmup} warm-up steps")
    unit = "tokens" if rows[0].get("tokens_per_s") is not None else "samples"
    mfus = [r.get("mfu") for r in rows]
    return {
        "run_dir": str(run_dir),
        "hosts": _hosts(run_dir),
        "unit": unit,
        "world_size": int(rows[-1].get("world_size", 1)),
        "steps_measured": len(rows),
        "per_s": statistics.median(float(r[f"{unit}_per_s"]) for r in rows),
        "per_s_per_device": statistics.median(float(r[f"{unit}_per_s_per_device"]) for r in rows),
        "step_time_s": statistics.median(float(r["step_time_s"]) for r in rows),
        "data_time_s": statistics.median(float(r.get("data_time_s") or 0.0) for r in rows),
        "mfu": None
        if any(m is None for m in mfus)
        else statistics.median(float(m) for m in mfus if m is not None),
    }


def _hosts(run_dir: Path) -> list[str]:
    """The hosts the run trained on (lineage.json), so a failing figure can name them."""
    try:
        return [str(h) for h in json.loads(RunLayout(run_dir).lineage.read_text()).get("hosts", [])]
    except (OSError, ValueError):
        return []


def measure_throughput(
    cfg: JobConfig, steps: int, warmup: int, repeats: int, out_dir: Path, nproc: int | None = None
) -> dict[str, Any] | None:
    """Train ``repeats`` benchmark runs of ``cfg`` and report the median of their figures.

    Under torchrun or srun every rank trains, but only rank 0 (which wrote metrics.jsonl) reads
    the figures back; the other ranks return None.
    """
    from hpcpipe.launch.job import run_job
    from hpcpipe.train.environment import detect_environment

    if repeats < 1:
        raise UserError("--repeats must be >= 1")
    is_main = detect_environment().rank == 0
    runs = []
    for index in range(repeats):
        job = bench_job(cfg, f"{cfg.run.name}-throughput-{index}", out_dir, steps, warmup, nproc=nproc)
        run_dir = run_job(job)
        if is_main:
            runs.append(summarize_run(run_dir, warmup))
    return combine_runs(cfg, runs) if is_main else None


def combine_runs(cfg: JobConfig, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median over runs of each figure, with samples/s derived for token-counting recipes."""
    unit = runs[0]["unit"]
    mfus = [r["mfu"] for r in runs]
    per_device = statistics.median(r["per_s_per_device"] for r in runs)
    result: dict[str, Any] = {
        "recipe": cfg.run.recipe,
        "name": cfg.run.name,
        "unit": unit,
        "world_size": runs[0]["world_size"],
        "hosts": sorted({h for r in runs for h in r["hosts"]}),
        "per_s": statistics.median(r["per_s"] for r in runs),
        "per_s_per_device": per_device,
        "step_time_s": statistics.median(r["step_time_s"] for r in runs),
        "mfu": None if any(m is None for m in mfus) else statistics.median(mfus),
        "global_batch_size": cfg.train.global_batch_size,
        "precision": cfg.train.precision,
        "runs": runs,
    }
    if unit == "tokens":
        result["samples_per_s_per_device"] = per_device / cfg.model.seq_len
    return result
