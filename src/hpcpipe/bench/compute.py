"""Compute ceilings of one device: matmul throughput per dtype, memory and host-device bandwidth.

These are the two roofs of the roofline (``hpcpipe roofline``) and the compute rows of
``hpcpipe accept``. Each figure is the median over ``repeats`` timed windows of at least
``min_time_s / repeats`` seconds each, after a warm-up call, with a device synchronisation around
every window (never inside it), so kernel-launch gaps are not charged to the hardware.

- matmul: C = A @ B with square n x n operands; 2 n^3 FLOPs. fp32 runs with TF32 off; tf32 with it
  on (CUDA compute capability >= 8.0 only); bf16 and fp16 where the device runs them at all.
  n is 8192 on a GPU and 1024 on a CPU, smaller only where one call at that size outlasts a timing
  window (``min_time_s / repeats``): bf16 and fp16 emulated by a CPU without native units.
- memory copy: ``dst.copy_(src)`` of a buffer far larger than caches; bytes read + written
  (2 x size), the figure stream benchmarks and nvbandwidth report for device memory.
- host-device: pinned host buffer to device and back (CUDA only; a CPU has no separate host).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from hpcpipe.bench.host import available_host_memory
from hpcpipe.errors import UserError

if TYPE_CHECKING:
    import torch

MATMUL_DTYPES = ("fp32", "tf32", "bf16", "fp16")
# Defaults sized so one figure takes well under a second: n = 8192 keeps an H100's tensor cores
# saturated (1.1 TFLOP per call); n = 1024 is 2 GFLOP, tens of milliseconds on a laptop core.
CUDA_MATMUL_N = 8192
CPU_MATMUL_N = 1024
PROBE_N = 256  # where the climb to the default n starts (and the smallest n it settles on)
CUDA_COPY_BYTES = 1 << 30
CPU_COPY_BYTES = 128 << 20  # several times a server's last-level cache
_TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class ComputeSpec:
    """What to measure; JSON-able so worker processes can receive it."""

    dtypes: list[str]
    matmul_n: int | None = None  # None: the device default above
    copy_bytes: int | None = None
    min_time_s: float = 0.3
    repeats: int = 3

    @classmethod
    def build(
        cls, dtypes: list[str], matmul_n: int | None, copy_bytes: int | None, min_time_s: float, repeats: int
    ) -> ComputeSpec:
        unknown = [d for d in dtypes if d not in MATMUL_DTYPES]
        if unknown or not dtypes:
            bad = unknown[0] if unknown else "(none)"
            raise UserError(f"--dtypes: unknown dtype {bad!r} (known: {', '.join(MATMUL_DTYPES)})")
        if matmul_n is not None and matmul_n < 16:
            raise UserError("--matmul-n must be >= 16")
        if not 0 < min_time_s < math.inf:  # nan and inf ended in a ValueError or an OverflowError
            raise UserError(f"--min-time must be a finite number of seconds > 0 (got {min_time_s})")
        if repeats < 1:
            raise UserError(f"--repeats must be >= 1 (got {repeats})")
        if copy_bytes is not None and copy_bytes < MIN_COPY_BYTES:  # it reported "0 MiB copy, 0 GB/s"
            raise UserError(f"--copy-size must be 1M or more (got {copy_bytes} bytes)")
        return cls(list(dict.fromkeys(dtypes)), matmul_n, copy_bytes, min_time_s, repeats)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


MIN_COPY_BYTES = 1 << 20


def figure(value: float | None, unit: str, detail: str = "", skipped: str | None = None) -> dict[str, Any]:
    """One measured figure (or why it was not measured)."""
    return {"value": value, "unit": unit, "detail": detail, "skipped": skipped}


def measure_compute(spec: ComputeSpec, device: torch.device) -> dict[str, Any]:
    """Every figure of ``spec`` on ``device``, keyed matmul_<dtype>, memory_copy, host_to_device, ..."""
    import torch

    figures: dict[str, dict[str, Any]] = {}
    for dtype in spec.dtypes:
        figures[f"matmul_{dtype}"] = _matmul(dtype, device, spec)
    figures["memory_copy"] = _memory_copy(device, spec)
    figures.update(_host_device(device, spec))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {
        "device": str(device),
        "device_name": name,
        "threads": torch.get_num_threads(),
        "figures": figures,
    }


def time_callable(
    fn: Callable[[], object], sync: Callable[[], None], min_time_s: float, repeats: int
) -> float:
    """Median seconds per call over ``repeats`` windows, each long enough to swamp timer noise."""
    fn()  # warm-up: kernel selection, allocator, lazy initialisation
    sync()
    start = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - start, 1e-9)
    calls = max(1, math.ceil(min_time_s / repeats / one))
    samples = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


def _syncer(device: torch.device) -> Callable[[], None]:
    import torch

    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _matmul(dtype: str, device: torch.device, spec: ComputeSpec) -> dict[str, Any]:
    import torch

    unit = "TFLOP/s"
    reason = _unsupported(dtype, device)
    if reason is not None:
        return figure(None, unit, skipped=reason)
    torch_dtype = getattr(torch, _TORCH_DTYPES[dtype])
    if spec.matmul_n is not None and not _matmul_fits(spec.matmul_n, torch_dtype, device):
        raise UserError(
            f"--matmul-n: three {spec.matmul_n} x {spec.matmul_n} {dtype} matrices "
            f"({_matmul_bytes(spec.matmul_n, torch_dtype) >> 20} MiB) do not fit in the "
            f"{free_bytes(device) >> 20} MiB of free {device.type} memory"
        )
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
    try:
        n = spec.matmul_n or _fitted_n(torch_dtype, device, spec)
        seconds = _time_matmul(n, torch_dtype, device, spec.min_time_s, spec.repeats)
    finally:
        torch.set_float32_matmul_precision(previous)
    return figure(2 * n**3 / seconds / 1e12, unit, f"n={n}, {seconds * 1e3:.3g} ms")


def _operands(n: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    """A, B and the output of an n x n matmul, made in ``dtype`` (no fp32 staging copy)."""
    import torch

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return a, b, torch.empty(n, n, device=device, dtype=dtype)


def _time_matmul(n: int, dtype: torch.dtype, device: torch.device, min_time_s: float, repeats: int) -> float:
    import torch

    a, b, out = _operands(n, dtype, device)
    return time_callable(lambda: torch.mm(a, b, out=out), _syncer(device), min_time_s, repeats)


def _one_call_seconds(n: int, dtype: torch.dtype, device: torch.device) -> float:
    """Seconds of one n x n matmul: the faster of two calls, the first paying any warm-up."""
    import torch

    a, b, out = _operands(n, dtype, device)
    sync, best = _syncer(device), math.inf
    for _ in range(2):
        sync()
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def _fitted_n(dtype: torch.dtype, device: torch.device, spec: ComputeSpec) -> int:
    """The device default n, unless one call at it outlasts a timing window (or memory).

    n doubles from PROBE_N towards the default, one call timed at each size, until the default
    or a call longer than the window: each call costs at most 8x the last, so a CPU emulating
    bf16 (~100x slower than fp32) never runs seconds-long calls. A rate from one small probe
    cannot stand in for the climb: small matmuls are launch-bound on a GPU, and a 1 ms probe
    on a shared CPU core is noise (it picked n from 320 to 1024 on back-to-back runs).
    """
    default = CUDA_MATMUL_N if device.type == "cuda" else CPU_MATMUL_N
    window = spec.min_time_s / spec.repeats
    n = PROBE_N
    while True:
        seconds = _one_call_seconds(n, dtype, device)
        if seconds > window:  # shrink as time scales with n^3, to no less than the n that fitted
            return max(PROBE_N, n // 2, int(n * (window / seconds) ** (1 / 3)) // 64 * 64)
        bigger = min(2 * n, default)
        if n == default or not _matmul_fits(bigger, dtype, device):
            return n
        n = bigger


def _matmul_bytes(n: int, dtype: torch.dtype) -> int:
    import torch

    return 3 * n * n * torch.empty((), dtype=dtype).element_size()


def _matmul_fits(n: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether A, B and the output of an n x n matmul fit in the free memory of ``device``
    (`--matmul-n 200000` failed in the allocator, with its traceback)."""
    return _matmul_bytes(n, dtype) <= free_bytes(device)


def _unsupported(dtype: str, device: torch.device) -> str | None:
    """Why ``dtype`` matmuls cannot run on ``device`` (None when they can)."""
    import torch

    if device.type == "cuda":
        major, _ = torch.cuda.get_device_capability(device)
        if dtype == "tf32" and major < 8:
            return "TF32 needs compute capability >= 8.0 (Ampere or newer)"
        if dtype == "bf16" and not torch.cuda.is_bf16_supported():
            return "this GPU has no bf16 support"
        return None
    if dtype == "tf32":
        return "TF32 is a CUDA tensor-core mode; a CPU has none"
    if dtype in ("bf16", "fp16"):
        probe_dtype = torch.bfloat16 if dtype == "bf16" else torch.float16
        try:
            torch.mm(torch.ones(8, 8, dtype=probe_dtype), torch.ones(8, 8, dtype=probe_dtype))
        except RuntimeError as exc:
            return f"{dtype} matmul not available on this CPU build: {str(exc).splitlines()[0]}"
    return None


def _memory_copy(device: torch.device, spec: ComputeSpec) -> dict[str, Any]:
    import torch

    size = spec.copy_bytes or _default_copy_bytes(device)
    _fits_twice(size, device)
    count = size // 4
    src = torch.ones(count, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    seconds = time_callable(lambda: dst.copy_(src), _syncer(device), spec.min_time_s, spec.repeats)
    return figure(2 * count * 4 / seconds / 1e9, "GB/s", f"{count * 4 >> 20} MiB copy, read + write")


def free_bytes(device: torch.device) -> int:
    """Free memory of ``device``: the GPU's, or the host's for a CPU."""
    import torch

    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else available_host_memory()


def _fits_twice(size: int, device: torch.device) -> None:
    """The copy's two buffers fit the free memory of ``device``; a UserError naming --copy-size
    otherwise (``--copy-size 1T`` failed in the allocator, with its traceback)."""
    free = free_bytes(device)
    if 2 * size > free:
        raise UserError(
            f"--copy-size: two buffers of {size >> 20} MiB do not fit in the {free >> 20} MiB of free "
            f"{device.type} memory"
        )


def _host_device(device: torch.device, spec: ComputeSpec) -> dict[str, dict[str, Any]]:
    import torch

    if device.type != "cuda":
        reason = "no accelerator: host and device memory are the same"
        return {
            "host_to_device": figure(None, "GB/s", skipped=reason),
            "device_to_host": figure(None, "GB/s", skipped=reason),
        }
    size = min(spec.copy_bytes or _default_copy_bytes(device), 256 << 20)
    host = torch.ones(size // 4, dtype=torch.float32).pin_memory()
    dev = torch.empty(size // 4, dtype=torch.float32, device=device)
    sync = _syncer(device)
    h2d = time_callable(lambda: dev.copy_(host, non_blocking=True), sync, spec.min_time_s, spec.repeats)
    d2h = time_callable(lambda: host.copy_(dev, non_blocking=True), sync, spec.min_time_s, spec.repeats)
    detail = f"{size >> 20} MiB, pinned host memory"
    return {
        "host_to_device": figure(size / h2d / 1e9, "GB/s", detail),
        "device_to_host": figure(size / d2h / 1e9, "GB/s", detail),
    }


def _default_copy_bytes(device: torch.device) -> int:
    import torch

    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return min(CUDA_COPY_BYTES, free // 4)
    return min(CPU_COPY_BYTES, available_host_memory() // 8)
