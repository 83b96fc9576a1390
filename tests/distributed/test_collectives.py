"""The collectives benchmark on 2 gloo ranks: every collective, the result check, nccl-tests' bus factors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcpipe.bench.bus import COLLECTIVES, bus_factor
from hpcpipe.bench.collectives import CollectiveSpec
from hpcpipe.bench.runner import run_bench

SIZES = [1024, 1 << 16, 1 << 20]


@pytest.mark.distributed
@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_collective_on_two_gloo_ranks(dtype: str) -> None:
    spec = CollectiveSpec.build(list(COLLECTIVES), SIZES, dtype, warmup=1, iters=3)
    result = run_bench(
        {"connectivity": {}, "collectives": spec.to_dict()}, nproc=2, backend="gloo", timeout_s=60
    )
    assert result is not None
    conn, coll = result["connectivity"], result["collectives"]
    assert conn["world_size"] == 2 and [r["rank"] for r in conn["ranks"]] == [0, 1]
    assert conn["ranks"][1]["rtt_ms"] > 0
    assert coll["world_size"] == 2 and coll["backend"] == "gloo" and coll["dtype"] == dtype
    assert {(r["collective"], r["requested_bytes"]) for r in coll["results"]} == {
        (c, s) for c in COLLECTIVES for s in SIZES
    }
    for r in coll["results"]:
        assert r["correct"] is True and r["wrong_ranks"] == [], r
        assert len(r["per_rank_time_s"]) == 2 and r["slowest_rank"] in (0, 1)
        assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / r["time_s"] / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * bus_factor(r["collective"], 2))


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_cli_writes_json_and_plot(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out, png = tmp_path / "coll.json", tmp_path / "coll.png"
    proc = cli(
        "bench",
        "collectives",
        "--nproc",
        "2",
        "-c",
        "all_reduce,all_to_all",
        "--sizes",
        "1K:16K:4",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--json",
        str(out),
        "--plot",
        str(png),
        cwd=tmp_path,
        timeout=110,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [r["size_bytes"] for r in result["results"]] == [1024, 4096, 16384] * 2
    assert all(r["correct"] for r in result["results"])
    assert png.stat().st_size > 10_000
    assert "busbw GB/s" in proc.stdout


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_a_failing_task_keeps_earlier_results_and_names_the_rank() -> None:
    import socket

    from hpcpipe.bench.runner import BenchFailure

    with pytest.raises(BenchFailure) as failure:
        run_bench({"connectivity": {}, "no_such_task": {}}, nproc=2, backend="gloo", timeout_s=60)
    assert "benchmark workers failed (exit code 1): rank 0 on" in str(failure.value)
    assert f"on {socket.gethostname()}: ValueError: unknown benchmark task 'no_such_task'" in str(
        failure.value
    )
    assert failure.value.partial["connectivity"]["world_size"] == 2


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_sizes_beyond_memory_are_one_user_error_from_both_ranks() -> None:
    from hpcpipe.errors import UserError

    spec = CollectiveSpec.build(["all_reduce"], [1 << 50], "float32", warmup=0, iters=1)
    with pytest.raises(UserError, match=r"^--sizes: 1024T does not fit"):
        run_bench({"collectives": spec.to_dict()}, nproc=2, backend="gloo", timeout_s=60)
