"""Compute ceilings on the CPU: every figure present or skipped with a reason; input checks; the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from hpcpipe.bench.compute import ComputeSpec, measure_compute, time_callable
from hpcpipe.errors import UserError


def test_cpu_figures_and_skips() -> None:
    spec = ComputeSpec.build(
        ["fp32", "tf32", "bf16"], matmul_n=64, copy_bytes=1 << 20, min_time_s=0.02, repeats=2
    )
    result = measure_compute(spec, torch.device("cpu"))
    figures = result["figures"]
    assert set(figures) == {
        "matmul_fp32",
        "matmul_tf32",
        "matmul_bf16",
        "memory_copy",
        "host_to_device",
        "device_to_host",
    }
    assert figures["matmul_fp32"]["value"] > 0 and figures["matmul_fp32"]["unit"] == "TFLOP/s"
    assert "n=64" in figures["matmul_fp32"]["detail"]
    assert figures["matmul_tf32"]["value"] is None and "CUDA" in figures["matmul_tf32"]["skipped"]
    assert figures["memory_copy"]["value"] > 0 and figures["memory_copy"]["unit"] == "GB/s"
    assert figures["host_to_device"]["value"] is None and figures["host_to_device"]["skipped"]
    # the fp32 figure was measured with TF32 off, and the setting is restored afterwards
    assert torch.get_float32_matmul_precision() == "highest"


def test_time_callable_divides_by_calls() -> None:
    calls = []
    seconds = time_callable(lambda: calls.append(1), lambda: None, min_time_s=0.01, repeats=3)
    assert seconds > 0 and len(calls) > 3  # warm-up, calibration, then whole windows


def test_spec_rejects_bad_input() -> None:
    with pytest.raises(UserError, match="--dtypes: unknown dtype 'fp8'"):
        ComputeSpec.build(["fp8"], None, None, 0.1, 1)
    with pytest.raises(UserError, match="--matmul-n"):
        ComputeSpec.build(["fp32"], 4, None, 0.1, 1)
    with pytest.raises(UserError, match="--min-time"):
        ComputeSpec.build(["fp32"], None, None, 0.0, 1)
    for endless in (float("nan"), float("inf")):  # a ValueError and an OverflowError before
        with pytest.raises(UserError, match="--min-time must be a finite number"):
            ComputeSpec.build(["fp32"], None, None, endless, 1)


def test_cli_json_is_what_roofline_reads(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "ceilings.json"
    proc = cli(
        "bench",
        "compute",
        "--dtypes",
        "fp32",
        "--matmul-n",
        "128",
        "--copy-size",
        "4M",
        "--min-time",
        "0.05",
        "--device",
        "cpu",
        "--json",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["figures"]["matmul_fp32"]["value"] > 0
    from hpcpipe.bench.roofline import ceilings_from_compute

    roofs = ceilings_from_compute(data, "fp32", str(out))
    assert roofs.peak_flops == pytest.approx(data["figures"]["matmul_fp32"]["value"] * 1e12)
    bad = cli("bench", "compute", "--device", "tpu:0")
    assert bad.returncode == 2 and "--device" in bad.stderr


def test_a_copy_size_that_cannot_be_measured_is_named() -> None:
    """--copy-size 3 reported '0 MiB copy, 0 GB/s'; --copy-size 1T failed in the allocator."""
    import torch

    from hpcpipe.bench.compute import ComputeSpec, _fits_twice
    from hpcpipe.errors import UserError

    with pytest.raises(UserError, match="--copy-size must be 1M or more"):
        ComputeSpec.build(["fp32"], None, 3, 0.3, 1)
    with pytest.raises(UserError, match="--copy-size: two buffers of 1048576 MiB do not fit"):
        _fits_twice(1 << 40, torch.device("cpu"))
    _fits_twice(1 << 20, torch.device("cpu"))


def _timed_sizes(monkeypatch: pytest.MonkeyPatch, seconds_at: Any) -> list[int]:
    """Replace the timing of one matmul call by ``seconds_at(n)``; the sizes timed, in order."""
    from hpcpipe.bench import compute

    timed: list[int] = []

    def one_call(n: int, dtype: Any, device: Any) -> float:
        timed.append(n)
        return float(seconds_at(n))

    monkeypatch.setattr(compute, "_one_call_seconds", one_call)
    monkeypatch.setattr(compute, "free_bytes", lambda device: 1 << 40)
    return timed


@pytest.mark.parametrize(
    ("device", "seconds_at", "expected"),
    [
        # A GPU's small GEMMs are launch-bound: a 256^3 probe's rate predicted n ~ 3400-4400.
        ("cuda", lambda n: 1e-3 + 2 * n**3 / 700e12, 8192),
        ("cpu", lambda n: 2 * n**3 / 100e9, 1024),  # fp32 on a CPU: the default fits a window
    ],
)
def test_the_default_matmul_n_is_kept_when_one_call_fits_a_window(
    monkeypatch: pytest.MonkeyPatch, device: str, seconds_at: Any, expected: int
) -> None:
    from hpcpipe.bench.compute import _fitted_n

    timed = _timed_sizes(monkeypatch, seconds_at)
    spec = ComputeSpec.build(["fp32"], None, None, 0.3, 3)
    assert _fitted_n(torch.float32, torch.device(device), spec) == expected
    assert timed[-1] == expected  # judged by a real call at the default, not by a probe's rate


def test_matmul_n_shrinks_only_where_a_call_outlasts_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 emulated by a CPU (~1 GFLOP/s): the climb stops at the first call over the window."""
    from hpcpipe.bench.compute import _fitted_n

    timed = _timed_sizes(monkeypatch, lambda n: 2 * n**3 / 1e9)  # 33 ms at 256, 268 ms at 512
    n = _fitted_n(torch.bfloat16, torch.device("cpu"), ComputeSpec.build(["bf16"], None, None, 0.3, 3))
    assert 256 <= n < 512 and n % 64 == 0
    assert timed == [256, 512]  # no call at the default (2 s) was made


def test_a_matmul_n_beyond_memory_is_named() -> None:
    """--matmul-n 200000 failed in the allocator (RuntimeError: can't allocate memory)."""
    spec = ComputeSpec.build(["fp32"], 1 << 22, None, 0.01, 1)  # three 64 TiB matrices
    with pytest.raises(UserError, match=r"--matmul-n: three 4194304 x 4194304 fp32 matrices .* do not fit"):
        measure_compute(spec, torch.device("cpu"))
