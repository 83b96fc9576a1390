"""accept's PASS/FAIL logic with crafted measurements, the thresholds files, and the reports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hpcpipe.accept.evaluate import evaluate
from hpcpipe.accept.report import build_report, to_markdown, write_report
from hpcpipe.accept.thresholds import Thresholds, load_thresholds, shipped_names
from hpcpipe.errors import UserError

THRESHOLDS = Thresholds.model_validate(
    {
        "name": "test",
        "nproc": 4,
        "connectivity": {"max_rtt_ms": 1.0},
        "collectives": {"busbw_gbps": {"all_reduce": {"1M": 10.0, "1G": 100.0}}},
        "compute": {"matmul_tflops": {"bf16": 500.0, "tf32": 200.0}, "memory_bandwidth_gbps": 2000.0},
        "throughput": {"preset": "tiny", "min_per_s_per_device": 1000.0, "min_mfu": 0.3},
        "scaling": {"preset": "tiny", "nproc": [1, 2, 4], "mode": "weak", "min_efficiency": 0.8},
    }
)
HOSTS = ["gpu01", "gpu01", "gpu02", "gpu02"]


def collective(size: int, busbw: float, times: list[float], wrong: list[int] | None = None) -> dict[str, Any]:
    slowest = max(range(len(times)), key=lambda r: times[r])
    return {
        "collective": "all_reduce",
        "requested_bytes": size,
        "size_bytes": size,
        "busbw_gbps": busbw,
        "per_rank_time_s": times,
        "slowest_rank": slowest,
        "correct": not wrong,
        "wrong_ranks": wrong or [],
    }


def compute_rank(rank: int, bf16: float, copy: float) -> dict[str, Any]:
    return {
        "rank": rank,
        "host": HOSTS[rank],
        "device_name": "NVIDIA H100 80GB HBM3",
        "figures": {
            "matmul_bf16": {"value": bf16},
            "matmul_tf32": {"value": 350.0},
            "memory_copy": {"value": copy},
        },
    }


def good() -> dict[str, Any]:
    return {
        "connectivity": {
            "world_size": 4,
            "hosts": ["gpu01", "gpu02"],
            "ranks": [
                {"rank": r, "host": HOSTS[r], "rtt_ms": None if r == 0 else 0.05 * r} for r in range(4)
            ],
        },
        "collectives": {
            "hosts": HOSTS,
            "results": [collective(1 << 20, 20.0, [1e-4] * 4), collective(1 << 30, 350.0, [5e-3] * 4)],
        },
        "compute": {"ranks": [compute_rank(r, 700.0, 2900.0) for r in range(4)]},
        "throughput": {
            "unit": "tokens",
            "world_size": 4,
            "hosts": ["gpu01", "gpu02"],
            "per_s_per_device": 5000.0,
            "mfu": 0.4,
        },
        "scaling": {
            "rows": [
                {"mode": "weak", "nproc": n, "step_time_s": t, "efficiency": 1.0 / t}
                for n, t in ((1, 1.0), (2, 1.05), (4, 1.1))
            ]
        },
    }


def by_check(rows: list[Any]) -> dict[str, Any]:
    return {r.check: r for r in rows}


def test_every_row_passes_on_good_measurements() -> None:
    rows = evaluate(THRESHOLDS, good(), launched_world=4)
    assert [r.check for r in rows] == [
        "ranks reachable",
        "rank 0 round trip",
        "all_reduce busbw @ 1M",
        "all_reduce busbw @ 1G",
        "matmul bf16",
        "matmul tf32",
        "memory bandwidth",
        "tiny throughput",
        "tiny MFU",
        "weak efficiency N=2",
        "weak efficiency N=4",
    ]
    assert all(r.passed for r in rows), [r.detail for r in rows if not r.passed]
    assert "gpu01 (2 ranks), gpu02 (2 ranks)" in by_check(rows)["ranks reachable"].detail


def test_slow_collective_names_rank_host_and_figures() -> None:
    m = good()
    m["collectives"]["results"][1] = collective(1 << 30, 80.0, [5e-3, 5e-3, 2e-2, 5e-3])
    row = by_check(evaluate(THRESHOLDS, m, 4))["all_reduce busbw @ 1G"]
    assert not row.passed and row.measured == 80.0 and row.required == 100.0
    assert "80 vs required >= 100 GB/s" in row.detail
    assert "rank 2 on gpu02, 20 ms vs median 5 ms" in row.detail


def test_wrong_collective_result_fails_even_when_fast() -> None:
    m = good()
    m["collectives"]["results"][0] = collective(1 << 20, 99.0, [1e-4] * 4, wrong=[3])
    row = by_check(evaluate(THRESHOLDS, m, 4))["all_reduce busbw @ 1M"]
    assert not row.passed and row.detail == "wrong result on rank 3 on gpu02"


def test_weakest_device_decides_compute_rows() -> None:
    m = good()
    m["compute"]["ranks"][1] = compute_rank(1, 420.0, 2900.0)
    row = by_check(evaluate(THRESHOLDS, m, 4))["matmul bf16"]
    assert not row.passed and row.measured == 420.0
    assert "lowest: rank 1 on gpu01" in row.detail


def test_unsupported_dtype_fails_with_the_reason() -> None:
    m = good()
    m["compute"]["ranks"][0]["figures"]["matmul_tf32"] = {
        "value": None,
        "skipped": "TF32 needs compute capability >= 8.0",
    }
    row = by_check(evaluate(THRESHOLDS, m, 4))["matmul tf32"]
    assert not row.passed and row.measured is None
    assert "not measured: rank 0 on gpu01: TF32 needs compute capability" in row.detail


def test_missing_rank_and_slow_link() -> None:
    m = good()
    m["connectivity"]["world_size"] = 3
    m["connectivity"]["ranks"] = m["connectivity"]["ranks"][:3]
    m["connectivity"]["ranks"][2]["rtt_ms"] = 7.5
    rows = by_check(evaluate(THRESHOLDS, m, 4))
    assert not rows["ranks reachable"].passed and "missing ranks: [3]" in rows["ranks reachable"].detail
    rtt = rows["rank 0 round trip"]
    assert not rtt.passed and rtt.comparison == "<=" and "slowest: rank 2 on gpu02" in rtt.detail


def test_failed_sections_fail_every_row_with_the_error() -> None:
    m = good()
    m["collectives"] = {
        "error": "benchmark workers failed (exit code 1): rank 3 on gpu02: RuntimeError: NCCL timeout"
    }
    del m["throughput"]
    rows = evaluate(THRESHOLDS, m, 4)
    failed = [r for r in rows if not r.passed]
    assert {r.check for r in failed} == {
        "all_reduce busbw @ 1M",
        "all_reduce busbw @ 1G",
        "tiny throughput",
        "tiny MFU",
    }
    assert all("rank 3 on gpu02" in r.detail for r in failed if r.section == "collectives")
    assert all(r.detail.startswith("not measured") for r in failed)


def test_a_size_beyond_memory_fails_its_own_row_named_by_its_key() -> None:
    m = good()
    m["collectives"]["results"] = m["collectives"]["results"][:1]  # 1M measured, 1G did not fit
    m["collectives"]["unfit"] = {str(1 << 30): "does not fit: each rank holds about 8 buffers"}
    rows = by_check(evaluate(THRESHOLDS, m, 4))
    assert rows["all_reduce busbw @ 1M"].passed
    unfit = rows["all_reduce busbw @ 1G"]
    assert not unfit.passed
    assert unfit.detail.startswith("not measured: collectives.busbw_gbps.all_reduce.1G: 1G does not fit: ")
    assert "--sizes" not in unfit.detail


def test_a_section_error_that_no_row_judged_is_a_failing_row() -> None:
    """A section whose thresholds made no row passed with its benchmark's error stored unread."""
    from hpcpipe.accept.evaluate import _judged, row

    (failed,) = _judged("compute", {"error": "ValueError: max() arg is an empty sequence"}, [])
    assert not failed.passed and failed.check == "compute benchmark" and "max() arg" in failed.detail
    rows = evaluate(THRESHOLDS, good(), 4)
    assert _judged("compute", good()["compute"], rows) == rows  # measured: nothing added
    unmeasured = [row("compute", "memory bandwidth", None, 1.0, "GB/s", why_missing="x")]
    assert _judged("compute", {"error": "x"}, unmeasured) == unmeasured  # a row says it already


def test_unknown_mfu_and_poor_scaling_fail() -> None:
    m = good()
    m["throughput"]["mfu"] = None
    m["scaling"]["rows"][2].update(step_time_s=2.0, efficiency=0.5)
    rows = by_check(evaluate(THRESHOLDS, m, 4))
    assert "observe.peak_tflops" in rows["tiny MFU"].detail and not rows["tiny MFU"].passed
    scale = rows["weak efficiency N=4"]
    assert not scale.passed and "2e+03 ms at N=4 vs 1e+03 ms at N=1" in scale.detail
    assert rows["weak efficiency N=2"].passed


def test_report_passes_only_when_every_row_passes(tmp_path: Path) -> None:
    ok = build_report(THRESHOLDS, "t.yaml", evaluate(THRESHOLDS, good(), 4), good(), 4)
    assert ok["passed"] and ok["counts"] == {"rows": 11, "passed": 11, "failed": 0}
    m = good()
    m["compute"]["ranks"][3] = compute_rank(3, 700.0, 1000.0)
    bad = build_report(THRESHOLDS, "t.yaml", evaluate(THRESHOLDS, m, 4), m, 4)
    assert not bad["passed"] and bad["counts"]["failed"] == 1
    md = to_markdown(bad)
    assert md.startswith("# Acceptance: FAIL (10/11 rows pass)")
    assert "- **memory bandwidth**: 1e+03 vs required >= 2e+03 GB/s; lowest: rank 3 on gpu02" in md
    json_path, md_path = write_report(bad, tmp_path)
    assert json_path.name == "acceptance.json" and md_path.read_text() == md
    empty = build_report(Thresholds(name="empty"), "t.yaml", [], {}, 1)
    assert not empty["passed"]  # nothing checked is not an acceptance


@pytest.mark.parametrize("name", ["cpu", "h100-8x-ib"])
def test_shipped_thresholds_load(name: str) -> None:
    assert name in shipped_names()
    th = load_thresholds(name)
    assert (
        th.name == name
        and th.collectives is not None
        and th.throughput is not None
        and th.scaling is not None
    )


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("name: x\ncollectives: {busbw_gbps: {allreduce: {1M: 1}}}\n", "unknown collective 'allreduce'"),
        ("name: x\ncollectives: {busbw_gbps: {all_reduce: {1Q: 1}}}\n", "cannot read size '1Q'"),
        ("name: x\ncompute: {matmul_tflops: {fp8: 1}}\n", "compute.matmul_tflops.fp8"),
        ("name: x\nthroughtput: {}\n", "throughtput"),
        (
            "name: x\nthroughput: {preset: nopreset, min_per_s_per_device: 1}\n",
            "throughput: unknown preset 'nopreset'",
        ),
        ("name: [x\n", "not valid YAML"),
        # Floors that pass anything, and a scaling section that makes no row: nothing was judged.
        ("name: x\ncollectives: {busbw_gbps: {all_reduce: {1M: -1}}}\n", "must be > 0 (got -1"),
        ("name: x\ncompute: {matmul_tflops: {fp32: 0}}\n", "must be > 0 (got 0"),
        ("name: x\nscaling: {preset: tiny, nproc: [4], min_efficiency: 0.7}\n", "two or more world sizes"),
        # inf passed "> 0" and ended in an OverflowError (a traceback) once the benchmarks ran.
        ("name: x\ntimeout_s: .inf\nconnectivity: {}\n", "timeout_s: Input should be a finite number"),
        ("name: x\ncompute: {min_time_s: .inf, matmul_tflops: {fp32: 1}}\n", "compute.min_time_s: Input"),
        ("name: x\ncollectives: {busbw_gbps: {all_reduce: {1M: .inf}}}\n", "finite number"),
        # Sections that make no row: the benchmark crashed, its error was stored, the report said PASS.
        ("name: x\ncollectives: {busbw_gbps: {}}\n", "collectives.busbw_gbps: Value error, name at least"),
        ("name: x\ncollectives: {busbw_gbps: {all_reduce: {}}}\n", "all_reduce: give at least one size"),
        ("name: x\ncompute: {}\n", "compute: Value error, sets no threshold"),
        ("name: x\ncompute: {min_time_s: 1}\n", "compute: Value error, sets no threshold"),
        # Named as the benchmark's flag (--dtype), or found only after the benchmarks had run.
        (
            "name: x\ncollectives: {dtype: bogus, busbw_gbps: {all_reduce: {1M: 1}}}\n",
            "collectives.dtype: Value error, unknown dtype 'bogus'",
        ),
        (
            "name: x\nscaling: {preset: tiny, nproc: [1, 2], min_efficiency: 0.5, mode: strong, "
            "set: [train.global_batch_size=3]}\n",
            "scaling: nproc 2: strong scaling splits train.global_batch_size (3)",
        ),
    ],
)
def test_bad_thresholds_name_the_file(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=r"bad\.yaml") as exc:
        load_thresholds(str(path))
    assert needle in str(exc.value)


def test_missing_thresholds_through_the_cli(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = cli("accept", "--thresholds", "no/such.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == "error: --thresholds: file not found: no/such.yaml"
    proc = cli("accept", "--thresholds", "a100", cwd=tmp_path)
    assert proc.returncode == 2 and "shipped: cpu, h100-8x-ib" in proc.stderr


def test_an_out_that_cannot_hold_the_report_is_refused_before_measuring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was found when writing the report, after the whole suite: the results were lost and
    the error ('File exists') did not name --out."""
    from hpcpipe.accept import suite
    from hpcpipe.cli.accept import accept

    def measure(*args: object, **kwargs: object) -> None:
        raise AssertionError("measured before checking --out")

    monkeypatch.setattr(suite, "measure", measure)
    thresholds = tmp_path / "conn.yaml"
    thresholds.write_text("name: c\nnproc: 1\nconnectivity: {min_world_size: 1}\n")
    afile = tmp_path / "afile"
    afile.write_text("")
    (tmp_path / "taken" / "acceptance.md").mkdir(parents=True)
    for out, needle in ((afile, "not a directory"), (tmp_path / "taken", "is a directory")):
        with pytest.raises(UserError, match=r"^--out: ") as exc:
            accept(thresholds=str(thresholds), out=out, nproc=None, json_out=None)
        assert needle in str(exc.value)
