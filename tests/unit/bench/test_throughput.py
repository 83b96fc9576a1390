"""Training throughput read back from metrics.jsonl: warm-up dropped, medians, MFU only when known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcpipe.bench.throughput import bench_job, combine_runs, measure_throughput, summarize_run
from hpcpipe.config import load_config
from hpcpipe.errors import UserError


def write_metrics(run_dir: Path, rows: list[dict]) -> Path:  # type: ignore[type-arg]
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "lineage.json").write_text(json.dumps({"hosts": ["node1", "node2"]}))
    return run_dir


def train_row(step: int, rate: float, step_time: float, mfu: float | None = None) -> dict:  # type: ignore[type-arg]
    return {
        "step": step,
        "loss": 3.0,
        "tokens_per_s": 2 * rate,
        "tokens_per_s_per_device": rate,
        "mfu": mfu,
        "step_time_s": step_time,
        "data_time_s": 0.001,
        "world_size": 2,
    }


def test_summary_drops_warmup_and_eval_rows(tmp_path: Path) -> None:
    rows = [{"step": 0, "val_loss": 5.0, "val_ppl": 150.0}]
    rows += [train_row(1, 10.0, 9.0), train_row(2, 50.0, 2.0)]  # warm-up: compile, cold caches
    rows += [train_row(3, 100.0, 0.10, 0.30), train_row(4, 120.0, 0.08, 0.36), train_row(5, 90.0, 0.11, 0.27)]
    rows += [{"step": 5, "val_loss": 4.0, "val_ppl": 55.0}]
    summary = summarize_run(write_metrics(tmp_path / "run", rows), warmup=2)
    assert summary["steps_measured"] == 3
    assert summary["per_s_per_device"] == 100.0 and summary["per_s"] == 200.0
    assert summary["step_time_s"] == 0.10 and summary["mfu"] == 0.30
    assert (
        summary["unit"] == "tokens" and summary["world_size"] == 2 and summary["hosts"] == ["node1", "node2"]
    )


def test_mfu_is_none_when_any_row_lacks_a_peak(tmp_path: Path) -> None:
    rows = [train_row(1, 100.0, 0.1, 0.3), train_row(2, 100.0, 0.1, None)]
    assert summarize_run(write_metrics(tmp_path / "run", rows), warmup=0)["mfu"] is None


def test_no_rows_after_warmup_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="no training rows after the 5 warm-up steps"):
        summarize_run(write_metrics(tmp_path / "run", [train_row(1, 1.0, 1.0)]), warmup=5)


def test_combine_takes_the_median_run() -> None:
    cfg = load_config("tiny")
    runs = [
        {
            "unit": "tokens",
            "world_size": 1,
            "hosts": ["a"],
            "per_s": p,
            "per_s_per_device": p,
            "step_time_s": 1 / p,
            "mfu": None,
        }
        for p in (100.0, 300.0, 200.0)
    ]
    result = combine_runs(cfg, runs)
    assert (
        result["per_s_per_device"] == 200.0
        and result["samples_per_s_per_device"] == 200.0 / cfg.model.seq_len
    )
    assert result["mfu"] is None and len(result["runs"]) == 3


def test_bench_job_logs_every_step(tmp_path: Path) -> None:
    job = bench_job(load_config("tiny"), "b", tmp_path, steps=7, warmup=2, nproc=2, global_batch_size=16)
    assert (job.train.steps, job.observe.log_every, job.train.eval_every) == (9, 1, 0)
    assert job.parallel.nproc == 2 and job.train.global_batch_size == 16 and job.run_dir == tmp_path / "b"
    with pytest.raises(UserError, match="--steps"):
        bench_job(load_config("tiny"), "b", tmp_path, steps=0, warmup=2)


def test_real_run_of_the_tiny_preset(tmp_path: Path) -> None:
    cfg = load_config("tiny", [f"data.prepared_dir={tmp_path}/prepared"])
    result = measure_throughput(cfg, steps=4, warmup=2, repeats=1, out_dir=tmp_path / "runs", nproc=1)
    assert result is not None
    assert result["unit"] == "tokens" and result["world_size"] == 1
    assert result["per_s_per_device"] > 0 and result["per_s"] == pytest.approx(result["per_s_per_device"])
    assert result["runs"][0]["steps_measured"] == 4
    assert result["mfu"] is None  # no known peak for a CPU
    assert Path(result["runs"][0]["run_dir"]) == tmp_path / "runs" / "tiny-throughput-0"
    # Again in the same directory, from a job that checkpoints: measured again, not resumed from
    # the first run's last checkpoint (which trained nothing and reported the old rows).
    saving = load_config("tiny", [f"data.prepared_dir={tmp_path}/prepared", "checkpoint.every_steps=2"])
    first = measure_throughput(saving, steps=4, warmup=2, repeats=1, out_dir=tmp_path / "again", nproc=1)
    again = measure_throughput(saving, steps=4, warmup=2, repeats=1, out_dir=tmp_path / "again", nproc=1)
    assert first is not None and again is not None and first["runs"] != again["runs"]
    assert not (tmp_path / "again" / "tiny-throughput-0" / "checkpoints").exists()
