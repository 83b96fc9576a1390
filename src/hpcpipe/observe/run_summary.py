"""One row of facts about a finished run directory, read from its files alone.

Sweeps and scaling studies write these rows to CSV; reports redraw every plot from the CSVs. A
row needs only ``config.yaml``, ``lineage.json`` and ``metrics.jsonl``, so it can be rebuilt on
another machine from a copied run directory.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from hpcpipe.fsutil import read_json_object
from hpcpipe.layout import RunLayout
from hpcpipe.observe.metrics import read_metrics
from hpcpipe.yamlfile import read_yaml_file

RUN_COLUMNS = (
    "run_id",
    "job_id",
    "nodes",
    "devices",
    "global_batch_size",
    "micro_batch_size",
    "precision",
    "bucket_cap_mb",
    "num_workers",
    "channels_last",
    "throughput",
    "throughput_unit",
    "step_time_s",
    "data_time_s",
    "time_per_epoch_s",
    "final_val_loss",
    "final_accuracy",
    "git_sha",
    "config_hash",
)


def summarize_run_dir(run_dir: Path, skip_rows: int = 1) -> dict[str, Any]:
    """The row for ``run_dir``; medians over training rows after the first ``skip_rows`` (warm-up)."""
    layout = RunLayout(run_dir)
    config = read_yaml_file(layout.config, "run's config")
    lineage = read_json_object(layout.lineage)
    rows = read_metrics(run_dir)
    train = [r for r in rows if "loss" in r]
    timed = train[skip_rows:] or train
    evals = [r for r in rows if "val_loss" in r]
    unit = "tokens" if any("tokens_per_s" in r for r in train) else "samples"
    final = evals[-1] if evals else {}
    return {
        "run_id": run_dir.name,
        "job_id": lineage.get("job_id"),
        "nodes": len(lineage.get("hosts", [])) or None,
        "devices": lineage.get("world_size"),
        "global_batch_size": config["train"]["global_batch_size"],
        "micro_batch_size": config["train"]["micro_batch_size"],
        "precision": config["train"]["precision"],
        "bucket_cap_mb": config["parallel"]["bucket_cap_mb"],
        "num_workers": config["data"]["num_workers"],
        "channels_last": config["train"]["channels_last"],
        "throughput": _median(timed, f"{unit}_per_s"),
        "throughput_unit": unit,
        "step_time_s": _median(timed, "step_time_s"),
        "data_time_s": _median(timed, "data_time_s"),
        "time_per_epoch_s": _median(timed, "time_per_epoch_s"),
        "final_val_loss": final.get("val_loss"),
        "final_accuracy": final.get("val_acc"),
        "git_sha": lineage.get("git_sha"),
        "config_hash": lineage.get("config_hash"),
    }


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None
