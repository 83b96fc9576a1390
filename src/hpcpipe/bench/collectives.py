"""The collectives benchmark, run by every rank of a joined process group (nccl-tests in Python).

For each collective and size: one call on a rank-dependent pattern whose result every rank checks
(nccl-tests' ``#wrong`` column), ``warmup`` untimed calls, then ``iters`` back-to-back calls timed
between a barrier and a device synchronisation. Nothing is allocated or checked inside the timed
loop, so the figures are those of the collective itself (see ``benchmarks/collectives_overhead.py``).
Each rank times itself; rank 0 merges the per-rank times into one row per (collective, size):
the mean time over ranks (as nccl-tests reports), algbw and busbw (``hpcpipe.bench.bus``), and
the ranks that were slower than the rest.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from hpcpipe import compat
from hpcpipe.bench.bus import COLLECTIVES, bandwidths, dtype_name, element_count
from hpcpipe.bench.host import available_host_memory
from hpcpipe.errors import UserError
from hpcpipe.train.environment import node_name

if TYPE_CHECKING:
    import torch

    from hpcpipe.train.distributed import DistContext

# A rank slower than the median rank by more than this fraction is named as slow.
SLOW_RANK_TOLERANCE = 0.2
# Default sweep limits: 1 KiB up to the largest power of two that fits BUFFERS_PER_RANK times in
# each rank's free memory (input, output, the check's expected result and one chunk's
# temporaries, with room to spare), capped so a default sweep stays within minutes: 8 GiB on GPUs
# (the usual nccl-tests -e 8G), 64 MiB over gloo on CPU (loopback TCP at ~1-2 GB/s on small hosts).
DEFAULT_MIN_BYTES = 1 << 10
CUDA_MAX_BYTES = 8 << 30
CPU_MAX_BYTES = 64 << 20
BUFFERS_PER_RANK = 8


@dataclass(frozen=True)
class CollectiveSpec:
    """What to measure; JSON-able so the driver can hand it to worker processes."""

    collectives: list[str]
    sizes: list[int] | None  # None: the memory-bounded default sweep, agreed by all ranks
    dtype: str = "float32"
    warmup: int = 5
    iters: int = 20
    check: bool = True
    # A size beyond memory: False (`bench collectives`) refuses the run, naming --sizes; True
    # (`accept`) measures the sizes that fit and lists the others under "unfit", so one size fails
    # its own rows instead of the connectivity and every other size measured with it.
    skip_unfit: bool = False

    @classmethod
    def build(
        cls,
        collectives: list[str],
        sizes: list[int] | None,
        dtype: str,
        warmup: int,
        iters: int,
        check: bool = True,
        skip_unfit: bool = False,
    ) -> CollectiveSpec:
        """Validate user input (one UserError naming the flag) and normalise dtype aliases."""
        unknown = [c for c in collectives if c not in COLLECTIVES]
        if unknown or not collectives:
            raise UserError(
                f"--collectives: unknown collective {unknown[0] if unknown else '(none)'!r} "
                f"(known: {', '.join(COLLECTIVES)})"
            )
        try:
            name = dtype_name(dtype)
        except ValueError as exc:
            raise UserError(f"--dtype: {exc}") from None
        if warmup < 0 or iters < 1:
            raise UserError("--warmup must be >= 0 and --iters >= 1")
        return cls(list(dict.fromkeys(collectives)), sizes, name, warmup, iters, check, skip_unfit)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Prepared:
    run: Callable[[], object]  # the timed call
    check: Callable[[], bool]  # one call on the pattern, then a comparison with the expected result
    unchecked: str | None = None  # why ``check`` could not tell chunks apart: it is not run


def run_collectives(spec: CollectiveSpec, ctx: DistContext) -> dict[str, Any] | None:
    """Measure every (collective, size) on this rank; rank 0 returns the merged result."""
    import torch
    import torch.distributed as dist

    dtype = getattr(torch, spec.dtype)
    sizes, unfit = (default_sizes(ctx), {}) if spec.sizes is None else _fitting(spec, ctx)
    element = torch.empty((), dtype=dtype).element_size()
    local: list[dict[str, Any]] = []
    for collective in spec.collectives:
        for size in sizes:
            count = element_count(collective, size, element, ctx.world_size)
            if count == 0:
                continue  # smaller than one element per rank: nothing to move
            prepared = _prepare(collective, count, dtype, ctx)
            unchecked = prepared.unchecked if spec.check else None
            correct = prepared.check() if spec.check and unchecked is None else None
            seconds = time_collective(prepared.run, spec.warmup, spec.iters, ctx.device)
            local.append(
                {
                    "collective": collective,
                    "requested_bytes": size,
                    "size_bytes": count * element,
                    "count": count,
                    "time_s": seconds,
                    "correct": correct,
                    "unchecked": unchecked,
                }
            )
            del prepared
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, {"host": node_name(), "rows": local})
    if not ctx.is_main:
        return None
    return {
        "world_size": ctx.world_size,
        "backend": dist.get_backend(),
        "device": ctx.device.type,
        "dtype": spec.dtype,
        "warmup": spec.warmup,
        "iters": spec.iters,
        "hosts": [g["host"] for g in gathered],
        "results": merge_rank_rows([g["rows"] for g in gathered], [g["host"] for g in gathered]),
        "unfit": {str(size): why for size, why in unfit.items()},  # JSON keys: requested bytes
    }


def time_collective(run: Callable[[], object], warmup: int, iters: int, device: torch.device) -> float:
    """Seconds per call of ``run``: back-to-back calls between a barrier and a device sync."""
    import torch.distributed as dist

    for _ in range(warmup):
        run()
    _sync(device)
    dist.barrier()
    _sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        run()
    _sync(device)
    return (time.perf_counter() - start) / iters


def merge_rank_rows(per_rank: list[list[dict[str, Any]]], hosts: list[str]) -> list[dict[str, Any]]:
    """One row per (collective, size) from every rank's own rows (same order on every rank)."""
    world = len(per_rank)
    merged = []
    for index, first in enumerate(per_rank[0]):
        times = [rows[index]["time_s"] for rows in per_rank]
        mean_time = statistics.fmean(times)
        algbw, busbw = bandwidths(first["collective"], first["size_bytes"], mean_time, world)
        checks = [rows[index]["correct"] for rows in per_rank]
        slowest = max(range(world), key=lambda r: times[r])
        merged.append(
            {
                "collective": first["collective"],
                "requested_bytes": first.get("requested_bytes", first["size_bytes"]),
                "size_bytes": first["size_bytes"],
                "count": first["count"],
                "time_s": mean_time,
                "algbw_gbps": algbw / 1e9,
                "busbw_gbps": busbw / 1e9,
                "per_rank_time_s": times,
                "slowest_rank": slowest,
                "slowest_host": hosts[slowest],
                "slow_ranks": slow_ranks(times),
                "correct": None if checks[0] is None else all(checks),
                "unchecked": first.get("unchecked"),  # why correct is None though --check was on
                "wrong_ranks": [r for r, ok in enumerate(checks) if ok is False],
            }
        )
    return merged


def slow_ranks(times: list[float], tolerance: float = SLOW_RANK_TOLERANCE) -> list[int]:
    """Ranks whose time exceeds the median rank's by more than ``tolerance`` (a fraction)."""
    median = statistics.median(times)
    return [rank for rank, t in enumerate(times) if t > median * (1.0 + tolerance)]


def default_sizes(ctx: DistContext) -> list[int]:
    """Powers of two from 1 KiB to the largest size every rank has memory for (nccl-tests' sweep)."""
    cap = CUDA_MAX_BYTES if ctx.device.type == "cuda" else CPU_MAX_BYTES
    high = 1 << max(min(agreed_budget(ctx), cap).bit_length() - 1, 10)
    sizes = []
    size = DEFAULT_MIN_BYTES
    while size <= high:
        sizes.append(size)
        size *= 2
    return sizes


def agreed_budget(ctx: DistContext) -> int:
    """The largest buffer size (bytes) that fits BUFFERS_PER_RANK times in every rank's free memory
    (the minimum over ranks, so that every rank takes the same decision)."""
    import torch
    import torch.distributed as dist

    if ctx.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(ctx.device)
        budget = free // BUFFERS_PER_RANK
    else:
        budget = available_host_memory() // (BUFFERS_PER_RANK * ctx.local_world_size)
    agreed = torch.tensor([budget], dtype=torch.int64, device=ctx.device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    return int(agreed.item())


def _fitting(spec: CollectiveSpec, ctx: DistContext) -> tuple[list[int], dict[int, str]]:
    """The sizes of ``spec`` that can be allocated, and why each other one cannot; with
    ``skip_unfit`` off, a UserError instead (on every rank: the budget is agreed, so none waits
    in a collective), as `--sizes 100T` would fail in the allocator otherwise."""
    from hpcpipe.bench.bus import format_size

    sizes = spec.sizes or []
    budget = agreed_budget(ctx)
    unfit = {
        size: f"does not fit: each rank holds about {BUFFERS_PER_RANK} buffers of that size and the "
        f"free {ctx.device.type} memory allows at most "
        f"{format_size(1 << max(budget.bit_length() - 1, 0))} per buffer here"
        for size in sizes
        if size > budget
    }
    if unfit and not spec.skip_unfit:
        largest = max(unfit)
        raise UserError(f"--sizes: {format_size(largest)} {unfit[largest]}")
    return [size for size in sizes if size not in unfit], unfit


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------------------
# One set-up per collective: buffers, the timed call, and a check of the first call's result.
# Every value a check compares is a small integer that the dtype holds exactly, and so is every
# partial sum a reduction forms in the dtype, at any world size: results are compared exactly, so
# one rank's missing contribution fails the check (a tolerance scaled by the world let bf16 at 128
# ranks pass a no-op, and fp16 sums overflowed past 136 ranks). Outputs start at zero, which no
# correct result holds, so a call that writes nothing fails too.

# Data-movement chunks are labelled by sequences modulo a prime no larger than this (and than the
# dtype's exact integers), so the cycle built per chunk stays small.
_LABEL_LIMIT = 1 << 16
_MOST_SUMMAND = 7  # the largest value one rank adds at a position, room allowing


def _prepare(collective: str, count: int, dtype: torch.dtype, ctx: DistContext) -> _Prepared:
    setups: dict[str, Callable[[int, torch.dtype, DistContext], _Prepared]] = {
        "all_reduce": _all_reduce,
        "reduce": _reduce,
        "broadcast": _broadcast,
        "all_gather": _all_gather,
        "reduce_scatter": _reduce_scatter,
        "all_to_all": _all_to_all,
    }
    return setups[collective](count, dtype, ctx)


def exact_integers(dtype: torch.dtype) -> int:
    """L such that every integer 0..L is exact in ``dtype``: 256 for bf16, 2048 for fp16 (capped
    at fp32's 2^24, more than any check needs)."""
    import torch

    if dtype.is_floating_point:
        return min(round(2 / torch.finfo(dtype).eps), 1 << 24)
    return min(torch.iinfo(dtype).max, 1 << 24)


def summand_layout(world: int, dtype: torch.dtype) -> tuple[int, int]:
    """(groups, weights) of a reduction's pattern: position i sums the ranks r with r % groups ==
    i % groups, each adding 1 + (r + i) % weights. Groups keep at most L ranks on a position and
    weights shrink as they fill it, so that every partial sum stays <= L (exact)."""
    limit = exact_integers(dtype)
    groups = -(-world // limit)
    members = -(-world // groups)
    return groups, max(1, min(_MOST_SUMMAND, limit // members))


def rank_summands(rank: int, world: int, dtype: torch.dtype) -> torch.Tensor:
    """One period (groups x weights positions, int64 on the CPU) of what ``rank`` adds."""
    import torch

    groups, weights = summand_layout(world, dtype)
    positions = rank % groups + groups * torch.arange(weights)
    cycle = torch.zeros(groups * weights, dtype=torch.int64)
    cycle[positions] = 1 + (rank + positions) % weights
    return cycle


def summed(world: int, dtype: torch.dtype) -> torch.Tensor:
    """One period of the sum over all ranks of :func:`rank_summands` (int64 on the CPU)."""
    import torch

    groups, weights = summand_layout(world, dtype)
    ranks = torch.arange(world)
    total = torch.zeros(groups * weights, dtype=torch.int64)
    for step in range(weights):  # each rank adds at `weights` positions per period
        positions = ranks % groups + groups * step
        total.index_add_(0, positions, 1 + (ranks + positions) % weights)
    return total


def labelled(label: int, length: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A chunk that names ``label``: 1 + (a + b * j) % p at offset j, p the largest prime within the
    dtype's exact integers, (a, b) distinct for labels below p * (p - 1) (bf16: 62,750), so chunks
    of two elements or more with different labels differ, whatever their length. One element
    holds a alone: labels p apart look alike (:func:`label_capacity`, :func:`indistinct`)."""
    import torch

    prime = _largest_prime(min(exact_integers(dtype), _LABEL_LIMIT))
    start, step = label % prime, 1 + (label // prime) % (prime - 1)
    cycle = (start + step * torch.arange(min(length, prime))) % prime + 1
    return tile(cycle, 0, length, dtype, device)


def label_capacity(length: int, dtype: torch.dtype) -> int:
    """How many labels, from 0 on, :func:`labelled` keeps apart in chunks of ``length`` elements:
    p for one element (its value is the label modulo p), p * (p - 1) for two or more."""
    prime = _largest_prime(min(exact_integers(dtype), _LABEL_LIMIT))
    return prime if length == 1 else prime * (prime - 1)


def indistinct(labels: int, length: int, dtype: torch.dtype) -> str | None:
    """Why chunks of ``length`` elements cannot carry ``labels`` distinct labels (two chunks alike
    would let the check pass a chunk delivered to the wrong place); None when they can."""
    capacity = label_capacity(length, dtype)
    if labels <= capacity:
        return None
    larger = labels <= label_capacity(2, dtype)  # 1-element chunks that 2 would tell apart
    return (
        f"{length}-element {str(dtype).removeprefix('torch.')} chunks carry at most {capacity} "
        f"distinct labels, fewer than the {labels} chunks it moves"
        + ("; a size with 2 elements a chunk is checked" if larger else "")
    )


def tile(
    cycle: torch.Tensor, start: int, length: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """``length`` values of the sequence repeating ``cycle``, from position ``start``."""
    cycle = cycle.roll(-(start % len(cycle))).to(device=device, dtype=dtype)
    return cycle.repeat(-(-length // len(cycle)))[:length]


@functools.cache
def _largest_prime(limit: int) -> int:
    candidate = limit
    while any(candidate % d == 0 for d in range(2, int(candidate**0.5) + 1)):
        candidate -= 1
    return candidate


def _all_reduce(count: int, dtype: torch.dtype, ctx: DistContext) -> _Prepared:
    import torch
    import torch.distributed as dist

    buf = tile(rank_summands(ctx.rank, ctx.world_size, dtype), 0, count, dtype, ctx.device)
    expected = tile(summed(ctx.world_size, dtype), 0, count, dtype, ctx.device)
    return _Prepared(
        run=lambda: dist.all_reduce(buf),
        check=_checked(lambda: dist.all_reduce(buf), lambda: torch.equal(buf, expected)),
    )


def _reduce(count: int, dtype: torch.dtype, ctx: DistContext) -> _Prepared:
    import torch
    import torch.distributed as dist

    buf = tile(rank_summands(ctx.rank, ctx.world_size, dtype), 0, count, dtype, ctx.device)
    expected = tile(summed(ctx.world_size, dtype), 0, count, dtype, ctx.device) if ctx.rank == 0 else None

    def check() -> bool:
        dist.reduce(buf, dst=0)
        return torch.equal(buf, expected) if expected is not None else True

    return _Prepared(run=lambda: dist.reduce(buf, dst=0), check=check)


def _broadcast(count: int, dtype: torch.dtype, ctx: DistContext) -> _Prepared:
    import torch
    import torch.distributed as dist

    expected = labelled(0, count, dtype, ctx.device)
    buf = expected.clone() if ctx.rank == 0 else torch.zeros_like(expected)
    return _Prepared(
        run=lambda: dist.broadcast(buf, src=0),
        check=_checked(lambda: dist.broadcast(buf, src=0), lambda: torch.equal(buf, expected)),
    )


def _all_gather(count: int, dtype: torch.dtype, ctx: DistContext) -> _Prepared:
    import torch

    chunk = count // ctx.world_size
    inp = labelled(ctx.rank, chunk, dtype, ctx.device)
    out = torch.zeros(count, dtype=dtype, device=ctx.device)
    expected = _chunks(range(ctx.world_size), chunk, dtype, ctx.device)
    gather = compat.gather_into_tensor_fn()
    return _Prepared(
        run=lambda: gather(out, inp),
        check=_checked(lambda: gather(out, inp), lambda: torch.equal(out, expected)),
        unchecked=indistinct(ctx.world_size, chunk, dtype),
    )


def _reduce_scatter(count: int, dtype: torch.dtype, ctx: DistContext) -> _Prepared:
    import torch

    n = ctx.world_size
    chunk = count // n
    inp = tile(rank_summands(ctx.rank, n, dtype), 0, count, dtype, ctx.device)
    out = torch.zeros(chunk, dtype=dtype, device=ctx.device)
    expected = tile(summed(n, dtype), ctx.rank * chunk, chunk, dtype, ctx.device)
    scatter = compat.reduce_scatter_tensor_fn()
    return _Prepared(
        run=lambda: scatter(out, inp),
        check=_checked(lambda: scatter(out, inp), lambda: torch.equal(out, expected)),
    )


def _all_to_all(count: int, dtype: torch.dtype, ctx: DistContext) -> _Prepared:
    import torch
    import torch.distributed as dist

    n, r = ctx.world_size, ctx.rank
    chunk = count // n
    # Chunk j of rank r's input goes to rank j: label src * n + dst names both ends.
    inp = _chunks([r * n + dst for dst in range(n)], chunk, dtype, ctx.device)
    out = torch.zeros(count, dtype=dtype, device=ctx.device)
    expected = _chunks([src * n + r for src in range(n)], chunk, dtype, ctx.device)
    return _Prepared(
        run=lambda: dist.all_to_all_single(out, inp),
        check=_checked(lambda: dist.all_to_all_single(out, inp), lambda: torch.equal(out, expected)),
        unchecked=indistinct(n * n, chunk, dtype),
    )


def _chunks(labels: Iterable[int], chunk: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The labelled chunks one after the other, built in place (one chunk's worth of temporaries)."""
    import torch

    labels = list(labels)
    out = torch.empty(len(labels) * chunk, dtype=dtype, device=device)
    for index, label in enumerate(labels):
        out[index * chunk : (index + 1) * chunk] = labelled(label, chunk, dtype, device)
    return out


def _checked(call: Callable[[], object], verify: Callable[[], bool]) -> Callable[[], bool]:
    def check() -> bool:
        call()
        return verify()

    return check
