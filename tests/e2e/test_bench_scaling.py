"""Strong and weak scaling: batch plans, efficiencies from hand-computed step times, the CSV and plot."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from hpcpipe.bench.scaling import add_efficiency, batch_sizes, parse_nprocs, write_csv
from hpcpipe.config import load_config
from hpcpipe.errors import UserError


def test_strong_keeps_the_global_batch_weak_the_per_rank_batch() -> None:
    cfg = load_config("tiny")  # global 8, micro 4, nproc 1
    assert batch_sizes(cfg, "strong", 1) == (8, 4)
    assert batch_sizes(cfg, "strong", 4) == (8, 2)  # 2 sequences per rank: micro shrinks to fit
    assert batch_sizes(cfg, "weak", 1) == (8, 4)
    assert batch_sizes(cfg, "weak", 4) == (32, 4)
    quick = load_config("quickstart")  # global 16 over nproc 2: 8 per rank
    assert batch_sizes(quick, "weak", 1) == (8, 8)
    with pytest.raises(UserError, match="--nproc 3: strong scaling"):
        batch_sizes(cfg, "strong", 3)
    with pytest.raises(UserError, match="unknown scaling mode"):
        batch_sizes(cfg, "sideways", 2)


def test_efficiency_definitions() -> None:
    rows = [
        {"mode": "strong", "nproc": 1, "step_time_s": 1.0},
        {"mode": "strong", "nproc": 2, "step_time_s": 0.625},  # 1 / (2 * 0.625) = 0.8
        {"mode": "strong", "nproc": 4, "step_time_s": 0.25},  # ideal: 1.0
        {"mode": "weak", "nproc": 1, "step_time_s": 1.0},
        {"mode": "weak", "nproc": 4, "step_time_s": 1.25},  # 1 / 1.25 = 0.8
    ]
    eff = [r["efficiency"] for r in add_efficiency(rows)]
    assert eff == pytest.approx([1.0, 0.8, 1.0, 1.0, 0.8])


def test_smallest_world_size_is_the_baseline_without_n1() -> None:
    rows = add_efficiency(
        [
            {"mode": "strong", "nproc": 2, "step_time_s": 1.0},
            {"mode": "strong", "nproc": 8, "step_time_s": 0.5},  # 2 * 1.0 / (8 * 0.5) = 0.5
        ]
    )
    assert [r["efficiency"] for r in rows] == pytest.approx([1.0, 0.5])


def test_parse_nprocs() -> None:
    assert parse_nprocs("4,1,2,2") == [1, 2, 4]
    for bad in ("", "a,b", "0,1", "1;2"):
        with pytest.raises(UserError, match="--nproc"):
            parse_nprocs(bad)


def test_csv_and_plot(tmp_path: Path) -> None:
    from hpcpipe.report.plots_bench import plot_scaling

    rows = add_efficiency(
        [
            {
                "mode": m,
                "nproc": n,
                "step_time_s": t,
                "global_batch_size": 8,
                "micro_batch_size": 4,
                "per_s": 8 / t,
                "per_s_per_device": 8 / t / n,
                "unit": "tokens",
                "run_dir": "x",
            }
            for m, n, t in (("strong", 1, 1.0), ("strong", 2, 0.6), ("weak", 1, 1.0), ("weak", 2, 1.1))
        ]
    )
    with write_csv(rows, tmp_path / "s.csv").open() as f:
        read = list(csv.DictReader(f))
    assert [r["mode"] for r in read] == ["strong", "strong", "weak", "weak"]
    assert float(read[1]["efficiency"]) == pytest.approx(1 / 1.2)
    assert plot_scaling(rows, tmp_path / "s.png").stat().st_size > 10_000


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_cli_strong_scaling_of_tiny(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "scaling"
    proc = cli(
        "bench",
        "scaling",
        "tiny",
        "--nproc",
        "1,2",
        "--mode",
        "strong",
        "--steps",
        "4",
        "--warmup",
        "2",
        "--set",
        f"data.prepared_dir={tmp_path}/prepared",
        "--out",
        str(out),
        "--json",
        str(tmp_path / "s.json"),
        cwd=tmp_path,
        timeout=230,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "s.json").read_text())
    assert [(r["mode"], r["nproc"], r["global_batch_size"]) for r in result["rows"]] == [
        ("strong", 1, 8),
        ("strong", 2, 8),
    ]
    assert result["rows"][0]["efficiency"] == 1.0 and result["rows"][1]["efficiency"] > 0
    assert (out / "scaling.csv").is_file() and (out / "scaling.png").stat().st_size > 10_000
