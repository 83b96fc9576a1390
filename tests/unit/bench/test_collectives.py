"""The collectives benchmark on one rank (in-process), its merge of per-rank times, and its input checks."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace

import pytest

from hpcpipe.bench.bus import COLLECTIVES
from hpcpipe.bench.collectives import CollectiveSpec, merge_rank_rows, run_collectives, slow_ranks
from hpcpipe.config import ParallelConfig
from hpcpipe.errors import UserError
from hpcpipe.train.distributed import DistContext
from hpcpipe.train.environment import DistEnv

SINGLE = DistEnv(kind="single", rank=0, local_rank=0, world_size=1, local_world_size=1)


@pytest.fixture
def one_rank() -> Iterator[DistContext]:
    from hpcpipe.bench.group import bench_group

    with bench_group(ParallelConfig(backend="gloo", timeout_s=30), SINGLE) as ctx:
        yield ctx


def test_spec_validates_names_dtype_and_iterations() -> None:
    spec = CollectiveSpec.build(["all_reduce", "all_reduce", "broadcast"], [1024], "bf16", 1, 2)
    assert spec.collectives == ["all_reduce", "broadcast"] and spec.dtype == "bfloat16"
    with pytest.raises(UserError, match="--collectives: unknown collective 'allgather'"):
        CollectiveSpec.build(["allgather"], None, "fp32", 1, 1)
    with pytest.raises(UserError, match="--dtype: unknown dtype 'fp8'"):
        CollectiveSpec.build(["all_reduce"], None, "fp8", 1, 1)
    with pytest.raises(UserError, match="--iters"):
        CollectiveSpec.build(["all_reduce"], None, "fp32", 1, 0)


def test_every_collective_runs_and_checks_on_one_rank(one_rank: DistContext) -> None:
    spec = CollectiveSpec.build(list(COLLECTIVES), [4096, 1 << 16], "float32", 1, 2)
    result = run_collectives(spec, one_rank)
    assert result is not None and result["world_size"] == 1
    rows = result["results"]
    assert [(r["collective"], r["size_bytes"]) for r in rows] == [
        (c, s) for c in COLLECTIVES for s in (4096, 1 << 16)
    ]
    for r in rows:
        assert r["correct"] is True, r
        assert r["time_s"] > 0 and r["per_rank_time_s"] == [r["time_s"]]
        # one rank: all_reduce, all_gather, reduce_scatter and all_to_all move nothing over a bus
        expected_factor = 1.0 if r["collective"] in ("broadcast", "reduce") else 0.0
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * expected_factor)


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("collective", ["all_reduce", "reduce"])
def test_the_check_fails_when_the_result_is_wrong(
    one_rank: DistContext, collective: str, dtype_name: str
) -> None:
    import torch

    from hpcpipe.bench.collectives import _prepare

    dtype = getattr(torch, dtype_name)
    # Claim a larger world on a one-rank group: the sum misses every other rank's contribution
    # (a tolerance of eps x world passed this in bf16 from 128 ranks on).
    for world in (2, 128, 1024):
        assert _prepare(collective, 1024, dtype, replace(one_rank, world_size=world)).check() is False
    assert _prepare(collective, 1024, dtype, one_rank).check() is True


WORLDS = [2, 3, 5, 7, 8, 16, 31, 64, 100, 128, 129, 137, 144, 255, 256, 257, 300, 512, 1000, 1024]


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16", "float32"])
def test_reduction_sums_are_exact_and_miss_no_rank_at_any_world_size(dtype_name: str) -> None:
    import torch

    from hpcpipe.bench.collectives import rank_summands, summed, tile

    dtype, cpu, count = getattr(torch, dtype_name), torch.device("cpu"), 90  # 90: not a whole period
    for world in WORLDS:
        shares = [tile(rank_summands(r, world, dtype), 0, count, dtype, cpu) for r in range(world)]
        expected = tile(summed(world, dtype), 0, count, dtype, cpu)
        total = torch.zeros(count, dtype=dtype)
        for share in shares:  # one add at a time, rounding in the dtype as a ring does
            total += share
        assert torch.equal(total, expected), (dtype, world)
        # Every partial sum was exact, so a rank left out lowers the sum by its share: each rank
        # must add somewhere (bf16 at 128 ranks passed a no-op, fp16 at 144 failed a correct sum).
        assert all(bool(share.any()) for share in shares), (dtype, world)
        for missing in {0, world // 2, world - 1}:
            partial = torch.zeros(count, dtype=dtype)
            for rank, share in enumerate(shares):
                partial += share if rank != missing else 0
            assert not torch.equal(partial, expected), (dtype, world, missing)
        assert not torch.equal(torch.zeros_like(expected), expected)
        assert not torch.equal(shares[0], expected), "a no-op reduction passed"
        # reduce_scatter checks its own chunk: the same values as the whole sum's slice
        assert torch.equal(tile(summed(world, dtype), 40, 30, dtype, cpu), expected[40:70])


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16", "float32"])
def test_data_movement_chunks_are_exact_and_name_their_source(dtype_name: str) -> None:
    import torch

    from hpcpipe.bench.collectives import exact_integers, labelled

    dtype, cpu = getattr(torch, dtype_name), torch.device("cpu")
    chunks = {tuple(labelled(r, 2, dtype, cpu).tolist()) for r in range(1024)}
    assert len(chunks) == 1024  # all_gather: no two ranks' chunks alike, even in bf16
    long = labelled(5000, 3000, dtype, cpu)
    # exact (no two values rounded together) and never 0, which outputs start at
    assert long.min() >= 1 and long.max() <= exact_integers(dtype)
    assert len(long.unique()) == min(3000, {"bfloat16": 251, "float16": 2039}.get(dtype_name, 3000))


def test_chunks_too_short_to_tell_apart_are_not_checked(one_rank: DistContext) -> None:
    """A 1-element chunk holds its label modulo p: all_to_all's 256 labels at 16 ranks repeated in
    bf16 (p = 251), so a chunk delivered to the wrong rank could pass, and the row read "ok"."""
    import torch

    from hpcpipe.bench.collectives import _prepare, label_capacity, labelled

    bf16, cpu = torch.bfloat16, torch.device("cpu")
    assert (label_capacity(1, bf16), label_capacity(2, bf16)) == (251, 251 * 250)
    assert len({labelled(r, 1, bf16, cpu).item() for r in range(251)}) == 251
    assert torch.equal(labelled(251, 1, bf16, cpu), labelled(0, 1, bf16, cpu))  # where they repeat

    world16, world300 = replace(one_rank, world_size=16), replace(one_rank, world_size=300)
    why = _prepare("all_to_all", 16, bf16, world16).unchecked  # 16 chunks of 1 element per rank
    assert why == (
        "1-element bfloat16 chunks carry at most 251 distinct labels, fewer than the 256 chunks it "
        "moves; a size with 2 elements a chunk is checked"
    )
    assert _prepare("all_to_all", 32, bf16, world16).unchecked is None  # 2 elements a chunk
    assert _prepare("all_to_all", 16, torch.float32, world16).unchecked is None  # p = 65521
    assert _prepare("all_gather", 300, bf16, world300).unchecked is not None
    assert _prepare("all_gather", 600, bf16, world300).unchecked is None
    long = _prepare("all_to_all", 600, bf16, world300).unchecked  # 90,000 labels: no size holds them
    assert long is not None and long.endswith("fewer than the 90000 chunks it moves")


def test_a_row_that_could_not_be_checked_says_why(
    one_rank: DistContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcpipe.bench import collectives

    monkeypatch.setattr(collectives, "label_capacity", lambda length, dtype: 0)  # nothing tells apart
    spec = CollectiveSpec.build(["all_gather", "all_reduce"], [64], "float32", 0, 1)
    result = run_collectives(spec, one_rank)
    assert result is not None
    gather, reduce = result["results"]
    assert gather["correct"] is None and "at most 0 distinct labels" in gather["unchecked"]
    assert (reduce["correct"], reduce["unchecked"]) == (True, None)
    off = run_collectives(replace(spec, check=False), one_rank)
    assert off is not None and [(r["correct"], r["unchecked"]) for r in off["results"]] == [(None, None)] * 2


def test_default_sweep_is_powers_of_two_bounded_by_memory(one_rank: DistContext) -> None:
    from hpcpipe.bench.collectives import CPU_MAX_BYTES, DEFAULT_MIN_BYTES, default_sizes

    sizes = default_sizes(one_rank)
    assert sizes[0] == DEFAULT_MIN_BYTES and sizes[-1] <= CPU_MAX_BYTES
    assert all(b == 2 * a for a, b in itertools.pairwise(sizes))


def test_merge_names_the_slowest_rank_and_wrong_ranks() -> None:
    rank_rows = [
        [
            {
                "collective": "all_reduce",
                "requested_bytes": 1 << 20,
                "size_bytes": 1 << 20,
                "count": 1 << 18,
                "time_s": t,
                "correct": ok,
            }
        ]
        for t, ok in ((0.010, True), (0.011, True), (0.030, False), (0.010, True))
    ]
    (merged,) = merge_rank_rows(rank_rows, ["a", "a", "b", "b"])
    assert merged["time_s"] == pytest.approx(0.01525)
    assert merged["slowest_rank"] == 2 and merged["slowest_host"] == "b"
    assert merged["slow_ranks"] == [2]
    assert merged["correct"] is False and merged["wrong_ranks"] == [2]
    assert merged["busbw_gbps"] == pytest.approx((1 << 20) / 0.01525 * 1.5 / 1e9)


def test_slow_ranks_tolerance() -> None:
    assert slow_ranks([1.0, 1.0, 1.0, 1.19, 1.21]) == [4]  # median 1.0, tolerance 20 %
    assert slow_ranks([1.0, 1.0]) == []


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["-c", "all_reduce,allgather"], "--collectives: unknown collective 'allgather'"),
        (["--sizes", "4Q"], "--sizes: cannot read size '4Q'"),
        (["--dtype", "fp8"], "--dtype: unknown dtype 'fp8'"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(cli, args: list[str], needle: str) -> None:  # type: ignore[no-untyped-def]
    proc = cli("bench", "collectives", "--nproc", "1", *args)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [f"error: {lines[0][7:]}"] and needle in lines[0]


def test_sizes_beyond_memory_are_refused_naming_the_flag(
    one_rank: DistContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcpipe.bench import collectives

    monkeypatch.setattr(collectives, "available_host_memory", lambda: 8 * (1 << 20))  # 1 MiB a buffer
    spec = CollectiveSpec.build(["all_reduce"], [1024, 1 << 20], "float32", 0, 1)
    assert run_collectives(spec, one_rank) is not None
    too_big = CollectiveSpec.build(["all_reduce"], [1024, 1 << 21], "float32", 0, 1)
    with pytest.raises(UserError, match=r"--sizes: 2M does not fit.*at most 1M per buffer"):
        run_collectives(too_big, one_rank)


def test_accept_measures_the_sizes_that_fit_and_lists_the_others(
    one_rank: DistContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One size beyond memory refused the whole launch, losing the sizes that fit (``accept``)."""
    from hpcpipe.bench import collectives

    monkeypatch.setattr(collectives, "available_host_memory", lambda: 8 * (1 << 20))  # 1 MiB a buffer
    spec = CollectiveSpec.build(["all_reduce"], [1024, 1 << 21], "float32", 0, 1, skip_unfit=True)
    result = run_collectives(spec, one_rank)
    assert result is not None and [r["requested_bytes"] for r in result["results"]] == [1024]
    assert set(result["unfit"]) == {str(1 << 21)}
    assert (
        result["unfit"][str(1 << 21)].startswith("does not fit")
        and "at most 1M" in result["unfit"][str(1 << 21)]
    )
