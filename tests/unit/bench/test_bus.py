"""Bus bandwidth arithmetic against nccl-tests' definitions (doc/PERFORMANCE.md) and size parsing."""

from __future__ import annotations

import pytest

from hpcpipe.bench.bus import (
    COLLECTIVES,
    bandwidths,
    bus_factor,
    element_count,
    format_size,
    parse_size,
    parse_sizes,
    sweep,
)
from hpcpipe.errors import UserError

# nccl-tests' factors, written out per collective as PERFORMANCE.md states them.
NCCL_TESTS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1,
    "reduce": lambda n: 1,
}


def test_every_collective_has_a_factor() -> None:
    assert set(COLLECTIVES) == set(NCCL_TESTS)


@pytest.mark.parametrize("collective", sorted(NCCL_TESTS))
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, 16, 64, 1024])
def test_bus_factors_match_nccl_tests(collective: str, n: int) -> None:
    assert bus_factor(collective, n) == pytest.approx(NCCL_TESTS[collective](n), rel=1e-12)


def test_known_values() -> None:
    # 8 GPUs: all_reduce moves 2*7/8 = 1.75x the buffer over each link; all_gather 7/8.
    assert bus_factor("all_reduce", 8) == 1.75
    assert bus_factor("all_gather", 8) == 0.875
    assert bus_factor("all_reduce", 1) == 0.0


def test_bandwidths_are_size_over_time_times_factor() -> None:
    algbw, busbw = bandwidths("all_reduce", size_bytes=1 << 30, time_s=0.01, world_size=4)
    assert algbw == pytest.approx((1 << 30) / 0.01)
    assert busbw == pytest.approx(algbw * 1.5)


def test_unknown_collective_names_the_flag() -> None:
    with pytest.raises(UserError, match="--collectives: unknown collective 'allreduce'"):
        bus_factor("allreduce", 2)


def test_element_count_rounds_to_whole_chunks_per_rank() -> None:
    # all_gather's size counts every rank's chunk: 1000 bytes of fp32 over 3 ranks -> 3 x 83 elements.
    assert element_count("all_gather", 1000, 4, 3) == 249
    assert element_count("all_reduce", 1000, 4, 3) == 250  # one buffer, no chunking
    assert element_count("all_to_all", 8, 4, 4) == 0  # less than one element per rank


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8", 8),
        ("4K", 4096),
        ("64M", 64 << 20),
        ("1G", 1 << 30),
        ("1GiB", 1 << 30),
        ("2kb", 2048),
        ("1.5M", 3 << 19),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "M", "-1", "1X", "0.5", "12 parsecs"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(UserError, match="--sizes"):
        parse_size(text)


def test_parse_sizes_sweep_and_list() -> None:
    assert parse_sizes("1K:8K") == [1024, 2048, 4096, 8192]
    assert parse_sizes("1K:64K:4") == [1024, 4096, 16384, 65536]
    assert parse_sizes("64M,1M,1M") == [1 << 20, 64 << 20]
    assert sweep(3, 20) == [3, 6, 12]
    with pytest.raises(UserError, match="larger than maximum"):
        parse_sizes("8M:1M")
    with pytest.raises(UserError, match="factor"):
        parse_sizes("1K:8K:1")


def test_format_size_round_trips() -> None:
    for size in (8, 1024, 64 << 20, 1 << 30, 3 << 19):
        assert parse_size(format_size(size)) == size
    assert format_size(100) == "100B"
