"""Compute ceilings on the CPU: every figure present or skipped with a reason; input checks; the CLI."""

from __future__ import annotations

import json
from pathlib import Path

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
