"""Bus bandwidth arithmetic of nccl-tests, and the size sweeps the collectives benchmark runs.

nccl-tests reports two bandwidths per size (NVIDIA/nccl-tests, doc/PERFORMANCE.md):

- algbw = S / t, where S is the size nccl-tests prints in its ``size`` column: the per-rank
  buffer for all_reduce, broadcast and reduce; the *total* (n x per-rank chunk) size for
  all_gather (the gathered output), reduce_scatter (the input that is scattered) and all_to_all
  (the whole send buffer).
- busbw = algbw x factor(n), the factor turning algbw into the bandwidth each rank's link must
  sustain, comparable across world sizes and against the hardware's peak:
  all_reduce 2(n-1)/n (a reduce-scatter then an all-gather), reduce_scatter, all_gather and
  all_to_all (n-1)/n, broadcast and reduce 1.

Sizes follow nccl-tests too: ``-b MIN -e MAX -f 2`` sweeps powers of two. Units are binary
(1K = 1024 bytes) as in nccl-tests' ``-b 8 -e 128M``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from hpcpipe.errors import UserError

# How many equal chunks a collective's size S is split into: one per rank for the collectives
# whose size counts every rank's chunk, 1 for the rest. S must be a whole number of elements in
# every chunk, so sizes are rounded down to a multiple of (chunks x element size).
_CHUNKED = {"all_gather", "reduce_scatter", "all_to_all"}

BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}
COLLECTIVES: tuple[str, ...] = tuple(BUS_FACTORS)
# Element types of the collectives benchmark (torch names), and the short names also accepted.
DTYPES = ("float32", "float16", "bfloat16", "float64", "int32")
_DTYPE_ALIASES = {
    "fp32": "float32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "fp64": "float64",
}

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def bus_factor(collective: str, world_size: int) -> float:
    """nccl-tests' factor from algbw to busbw for ``collective`` over ``world_size`` ranks."""
    if collective not in BUS_FACTORS:
        raise UserError(f"--collectives: unknown collective {collective!r} (known: {', '.join(COLLECTIVES)})")
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    return BUS_FACTORS[collective](world_size)


def bandwidths(collective: str, size_bytes: int, time_s: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s for one operation of ``size_bytes`` (nccl-tests' S) in ``time_s``."""
    algbw = size_bytes / time_s if time_s > 0 else 0.0
    return algbw, algbw * bus_factor(collective, world_size)


def element_count(collective: str, size_bytes: int, element_size: int, world_size: int) -> int:
    """Elements in nccl-tests' S for this collective, rounded down to a whole chunk per rank."""
    chunks = world_size if collective in _CHUNKED else 1
    per_chunk = size_bytes // (element_size * chunks)
    return per_chunk * chunks


def parse_size(text: str, flag: str = "--sizes") -> int:
    """'8', '4K', '64M', '1GiB', '1.5M' -> bytes (binary units, as nccl-tests)."""
    match = _SIZE_RE.match(text)
    if match is None:
        raise UserError(f"{flag}: cannot read size {text!r} (examples: 8, 4K, 64M, 1G)")
    value = float(match.group(1)) * _UNITS[match.group(2).upper()]
    if value < 1 or value != int(value):
        raise UserError(f"{flag}: size {text!r} is not a whole positive number of bytes")
    return int(value)


def parse_sizes(text: str, flag: str = "--sizes") -> list[int]:
    """A sweep 'MIN:MAX' (powers of two, factor 2), 'MIN:MAX:FACTOR', or a list '1M,4M,64M'."""
    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise UserError(f"{flag}: expected MIN:MAX or MIN:MAX:FACTOR, got {text!r}")
        low, high = parse_size(parts[0], flag), parse_size(parts[1], flag)
        factor = _parse_factor(parts[2], flag) if len(parts) == 3 else 2
        if low > high:
            raise UserError(f"{flag}: minimum {parts[0]} is larger than maximum {parts[1]}")
        return sweep(low, high, factor)
    sizes = [parse_size(part, flag) for part in text.split(",") if part.strip()]
    if not sizes:
        raise UserError(f"{flag}: no sizes given")
    return sorted(set(sizes))


def sweep(low: int, high: int, factor: int = 2) -> list[int]:
    """low, low*factor, ... up to and including high (nccl-tests' -b/-e/-f)."""
    sizes = []
    size = low
    while size <= high:
        sizes.append(size)
        size *= factor
    return sizes


def format_size(size_bytes: int) -> str:
    """Bytes as nccl-tests-style binary units: 1024 -> '1K', 67108864 -> '64M', 100 -> '100B'."""
    for unit in ("T", "G", "M", "K"):
        scale = _UNITS[unit]
        if size_bytes >= scale and size_bytes % scale == 0:
            return f"{size_bytes // scale}{unit}"
    if size_bytes >= 1 << 10:
        return f"{size_bytes / (1 << 10):.1f}K"
    return f"{size_bytes}B"


def _parse_factor(text: str, flag: str) -> int:
    try:
        factor = int(text)
    except ValueError:
        factor = 0
    if factor < 2:
        raise UserError(f"{flag}: sweep factor must be an integer >= 2, got {text!r}")
    return factor


def dtype_name(dtype: str) -> str:
    """The torch name of ``dtype`` (aliases such as bf16 resolved); ValueError when unknown, for
    the caller to name where it came from (``--dtype``, a thresholds file's ``collectives.dtype``)."""
    name = _DTYPE_ALIASES.get(dtype.lower(), dtype.lower())
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)}, fp32, bf16, fp16)")
    return name
