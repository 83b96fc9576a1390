"""Roofline: FLOPs and bytes of hand-computed operations, memory- vs compute-bound, the model's ops."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hpcpipe.bench.roofline import Ceilings, Op, ceilings_from_compute, classify, matmul, model_ops, roofline
from hpcpipe.config import load_config
from hpcpipe.errors import UserError
from hpcpipe.models.gpt_flops import matmul_params

ROOFS = Ceilings(peak_flops=100e12, bandwidth=1e12, source="test")  # ridge at 100 FLOP/byte


def test_matmul_counts() -> None:
    op = matmul("x", m=4, k=8, n=2, s=2)
    assert op.flops == 2 * 4 * 2 * 8 == 128
    assert op.bytes == (4 * 8 + 8 * 2 + 4 * 2) * 2 == 112
    # square n x n x n in fp32: intensity 2n^3 / (3 n^2 4) = n / 6
    assert matmul("sq", 600, 600, 600, 4).intensity == pytest.approx(100.0)


def test_classification_against_the_ridge() -> None:
    ops = [
        Op("low", "elementwise", 50e9, 1e9),
        Op("ridge", "matmul", 100e9, 1e9),
        Op("high", "matmul", 400e9, 1e9, 2),
    ]
    rows = {r["name"]: r for r in classify(ops, ROOFS)}
    assert ROOFS.ridge == 100.0
    assert rows["low"]["bound"] == "memory" and rows["low"]["attainable_tflops"] == pytest.approx(50.0)
    assert rows["ridge"]["bound"] == "compute" and rows["ridge"]["attainable_tflops"] == pytest.approx(100.0)
    assert rows["high"]["bound"] == "compute" and rows["high"]["attainable_tflops"] == pytest.approx(100.0)
    # roofline times: max(F/P, Q/W) x count = 1 ms, 1 ms, 2 x 4 ms
    assert [r["time_s"] for r in rows.values()] == pytest.approx([1e-3, 1e-3, 8e-3])
    assert sum(r["time_share"] for r in rows.values()) == pytest.approx(1.0)


def test_gpt2_ops_of_the_tiny_preset() -> None:
    job = load_config("tiny")  # B 4, T 32, C 32, L 2, F 128, bytes vocabulary 257, fp32
    ops = {op.name: op for op in model_ops(job.model, 4, 257, "fp32")}
    m = 4 * 32
    assert (
        ops["attn.qkv"].flops == 2 * m * 32 * 96 and ops["attn.qkv"].bytes == (m * 32 + 32 * 96 + m * 96) * 4
    )
    assert ops["attn.qkv"].count == 2
    assert ops["attention (SDPA, causal)"].flops == 2 * 4 * 32 * 32 * 32  # 4 B T^2 C halved for the mask
    assert ops["attention (SDPA, causal)"].bytes == 4 * m * 32 * 4
    assert ops["layernorm (ln_1, ln_2)"].count == 4 and ops["layernorm (ln_1, ln_2)"].flops == 7 * m * 32
    assert ops["lm_head"].flops == 2 * m * 32 * 257
    assert "gelu" in ops and "rope (q, k)" not in ops


def test_matmul_flops_agree_with_the_mfu_formula() -> None:
    for preset in ("tiny", "llama-tiny"):
        job = load_config(preset)
        ops = model_ops(job.model, 2, 300, "bf16")
        total = sum(op.flops * op.count for op in ops if op.kind == "matmul")
        assert total == 2 * 2 * job.model.seq_len * matmul_params(
            job.model, 300
        )  # 2 FLOPs per weight per token


def test_llama_ops_and_bf16_bytes() -> None:
    job = load_config("llama-tiny")
    ops = {op.name: op for op in model_ops(job.model, 1, 4096, "bf16")}
    assert {"rope (q, k)", "silu(gate) * up", "mlp.gate, mlp.up", "rmsnorm (ln_f)"} <= set(ops)
    assert "gelu" not in ops
    assert ops["mlp.gate, mlp.up"].count == 2 * job.model.n_layers
    c = job.model.d_model
    assert ops["attn.proj"].bytes == (128 * c + c * c + 128 * c) * 2


def test_tiny_is_memory_bound_on_a_low_ridge_only_for_elementwise() -> None:
    result = roofline(load_config("tiny"), Ceilings(5e12, 1e12, "test"))  # ridge 5 FLOP/byte
    bounds = {op["name"]: op["bound"] for op in result["ops"]}
    assert bounds["attn.qkv"] == "compute"  # intensity 10.1
    assert bounds["layernorm (ln_1, ln_2)"] == "memory" and bounds["residual add"] == "memory"


def test_ceilings_from_compute_json() -> None:
    single = {"figures": {"matmul_bf16": {"value": 700.0}, "memory_copy": {"value": 3000.0}}}
    roofs = ceilings_from_compute(single, "bf16", "x.json")
    assert roofs.peak_flops == 700e12 and roofs.bandwidth == 3000e9
    per_rank = {
        "ranks": [single, {"figures": {"matmul_bf16": {"value": 650.0}, "memory_copy": {"value": 3100.0}}}]
    }
    assert ceilings_from_compute(per_rank, "bf16", "x.json").peak_flops == 650e12  # the weakest device
    with pytest.raises(UserError, match=re.escape("x.json: needs figures.matmul_fp16.value")):
        ceilings_from_compute(single, "fp16", "x.json")


def test_cli(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    png = tmp_path / "r.png"
    proc = cli(
        "roofline", "tiny", "--peak-tflops", "5", "--bandwidth-gbps", "1000", "--png", str(png), "--json", "-"
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert (
        result["ridge_flop_per_byte"] == pytest.approx(5.0)
        and result["ceilings_source"] == "given on the command line"
    )
    assert png.stat().st_size > 10_000
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    proc = cli("roofline", "tiny", "--ceilings", str(bad))
    assert proc.returncode == 2 and proc.stderr.strip() == f"error: --ceilings: cannot read JSON from {bad}"


def test_ceilings_that_are_no_object_or_no_number_are_one_line(tmp_path: Path) -> None:
    """A JSON list was an AttributeError traceback; --peak-tflops 0 a ZeroDivisionError; nan a
    matplotlib traceback; -1 plotted a broken roofline."""
    from tests.helpers import run_cli

    with pytest.raises(UserError, match="not the output of `hpcpipe bench compute --json`"):
        ceilings_from_compute([], "bf16", "l.json")  # type: ignore[arg-type]
    for roof in ("0", "nan", "-1", "inf"):
        proc = run_cli("roofline", "tiny", "--peak-tflops", roof, "--bandwidth-gbps", "100", cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.startswith(f"error: --peak-tflops {float(roof)}"), (
            proc.stderr
        )
