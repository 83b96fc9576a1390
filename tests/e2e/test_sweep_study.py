"""Sweeps (one CSV row per run, finished points skipped), the scaling study with bottleneck
verdicts, and `report study` regenerating every plot from the CSVs with the run directories gone."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from hpcpipe.bench.bottleneck import classify, exposed_communication
from hpcpipe.data.images.generator import write_dataset
from hpcpipe.errors import UserError
from hpcpipe.report.study import optimization_table, weak_variation
from hpcpipe.sweep import parse_grid_option, point_slug


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset("cifar10-binary", tmp_path_factory.mktemp("sweep") / "c", n_train=64, n_test=16)


def _sets(data: Path, tmp: Path) -> list[str]:
    sets = [
        f"data.root={data}",
        "data.format=cifar10-binary",
        f"data.prepared_dir={tmp}/prepared",
        "train.steps=3",
    ]
    return [arg for s in sets for arg in ("--set", s)]


def test_grid_options_parse_and_bad_ones_name_the_flag() -> None:
    assert parse_grid_option("train.precision=[fp32, bf16]") == ("train.precision", ["fp32", "bf16"])
    assert parse_grid_option("parallel.bucket_cap_mb=[25,50]") == ("parallel.bucket_cap_mb", [25, 50])
    for bad in ("train.precision=bf16", "=[1]", "train.steps"):
        with pytest.raises(UserError, match="--grid"):
            parse_grid_option(bad)
    assert (
        point_slug(("train.precision=bf16", "parallel.bucket_cap_mb=25")) == "precision_bf16-bucket_cap_mb_25"
    )


def test_bottleneck_verdicts() -> None:
    assert classify(1.0, 0.3, 0.1) == "input-bound"
    assert classify(1.0, 0.05, 0.6) == "communication-bound"
    assert classify(1.0, 0.05, 0.2) == "compute-bound"
    assert classify(1.0, 0.0, None) == "compute-bound"
    assert exposed_communication(0.5, 0.6) == 0.0 and exposed_communication(0.5, 0.3) == pytest.approx(0.2)


def test_optimization_table_pairs_runs_of_one_sweep_only() -> None:
    """Two sweeps of the same knob on other base configs: their rows paired across the sweeps."""
    rows = [
        {"sweep": "small", "precision": "fp32", "throughput": 100.0},
        {"sweep": "small", "precision": "bf16", "throughput": 150.0},
        {"sweep": "large", "precision": "fp32", "throughput": 10.0},
        {"sweep": "large", "precision": "bf16", "throughput": 12.0},
    ]
    (row,) = optimization_table(rows)
    assert row["pairs"] == 2 and row["ratio"] == pytest.approx((1.5 + 1.2) / 2)  # 4 pairs, 8.5x


def test_optimization_table_matches_runs_that_differ_in_one_knob() -> None:
    rows = [
        {"precision": "fp32", "num_workers": 0, "throughput": 100.0},
        {"precision": "bf16", "num_workers": 0, "throughput": 150.0},
        {"precision": "fp32", "num_workers": 2, "throughput": 120.0},
        {"precision": "bf16", "num_workers": 2, "throughput": 168.0},
    ]
    table = {(o["knob"], o["after"]): o for o in optimization_table(rows)}
    assert table[("precision", "bf16")]["ratio"] == pytest.approx(1.45)  # median of 1.5 and 1.4
    assert table[("precision", "bf16")]["pairs"] == 2
    assert table[("num_workers", 2)]["ratio"] == pytest.approx((1.2 + 1.12) / 2)
    weak = [
        {"mode": "weak", "nproc": n, "step_time_s": t, "time_per_epoch_s": None}
        for n, t in ((1, 1.0), (2, 1.08))
    ]
    assert weak_variation(weak) == pytest.approx(0.08)


@pytest.mark.slow
def test_sweep_writes_one_row_per_run_skips_finished_points_and_the_report_needs_only_csv(
    cli, data: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "study" / "sweep"
    # Two cheap knobs: bf16 on a CPU without bf16 units (AVX2) cost this test ~60 CPU-s of its
    # ~100; bf16 itself is trained end to end in test_precision_e2e.py.
    grid = ["--grid", "train.channels_last=[false,true]", "--grid", "parallel.bucket_cap_mb=[25,50]"]
    proc = cli("sweep", "resnet-tiny", *grid, *_sets(data, tmp_path), "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (out / "sweep.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and {r["status"] for r in rows} == {"trained"}
    for column in (
        "run_id",
        "job_id",
        "nodes",
        "devices",
        "global_batch_size",
        "precision",
        "bucket_cap_mb",
        "num_workers",
        "throughput",
        "time_per_epoch_s",
        "final_accuracy",
        "git_sha",
        "config_hash",
    ):
        assert column in rows[0]
    assert {(r["channels_last"], r["bucket_cap_mb"]) for r in rows} == {
        ("False", "25.0"),
        ("False", "50.0"),
        ("True", "25.0"),
        ("True", "50.0"),
    }
    assert all(float(r["throughput"]) > 0 and 0 <= float(r["final_accuracy"]) <= 1 for r in rows)
    assert all((out / r["run_id"] / "metrics.jsonl").is_file() for r in rows)

    again = cli("sweep", "resnet-tiny", *grid, *_sets(data, tmp_path), "--out", str(out), cwd=tmp_path)
    assert again.returncode == 0 and again.stdout.count("done before, skipped") == 4

    for row in rows:
        shutil.rmtree(out / row["run_id"])
    proc = cli("report", str(tmp_path / "study"))
    assert proc.returncode == 0, proc.stderr
    report = tmp_path / "study" / "report"
    assert (report / "sweep_throughput.png").stat().st_size > 10_000
    text = (report / "study.md").read_text()
    assert "| channels_last | False | True |" in text and "| bucket_cap_mb | 25.0 | 50.0 |" in text, text


def test_bad_sweep_input_is_one_line_exit_2(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = cli("sweep", "resnet-tiny", "--grid", "train.nope=[1,2]", "--out", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "unknown config key 'train.nope'" in proc.stderr
    proc = cli("sweep", "resnet-tiny", "--grid", "train.precision=[fp64]", "--out", str(tmp_path))
    assert proc.returncode == 2 and "train.precision" in proc.stderr
    proc = cli("report", str(tmp_path))
    assert proc.returncode == 2 and "no scaling.csv or sweep.csv" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_scaling_study_on_1_and_2_workers_then_report_from_csv_alone(cli, data: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "scaling"
    args = ["--nproc", "1,2", "--mode", "both", "--steps", "2", "--warmup", "1", "--out", str(out)]
    proc = cli("bench", "scaling", "resnet-tiny", *args, *_sets(data, tmp_path), cwd=tmp_path, timeout=380)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (out / "scaling.csv").open() as f:
        rows = {(r["mode"], int(r["nproc"])): r for r in csv.DictReader(f)}
    assert set(rows) == {("strong", 1), ("strong", 2), ("weak", 1), ("weak", 2)}
    assert rows[("strong", 2)]["global_batch_size"] == "16" and rows[("weak", 2)]["global_batch_size"] == "32"
    assert float(rows[("strong", 1)]["efficiency"]) == 1.0
    assert rows[("strong", 1)]["step_time_nosync_s"] == ""  # one rank has nothing to synchronise
    assert float(rows[("strong", 2)]["step_time_nosync_s"]) > 0 and rows[("strong", 2)]["bottleneck"] in {
        "compute-bound",
        "communication-bound",
        "input-bound",
    }
    assert rows[("weak", 2)]["devices"] == "2" and float(rows[("weak", 2)]["time_per_epoch_s"]) > 0
    for run in [p for p in out.iterdir() if p.is_dir()]:
        shutil.rmtree(run)
    proc = cli("report", str(out))
    assert proc.returncode == 0, proc.stderr
    for name in ("scaling_throughput.png", "scaling_efficiency.png", "weak_time_per_epoch.png"):
        assert (out / "report" / name).stat().st_size > 10_000
    assert "| strong | 2 |" in (out / "report" / "study.md").read_text()
