"""Mixed precision: the gradient scaler is for fp16 only (the runs: tests/e2e/test_precision_e2e.py)."""

from __future__ import annotations


def test_precision_unit_scaler_only_for_fp16() -> None:
    import torch

    from hpcpipe.train.precision import Precision

    cpu = torch.device("cpu")
    assert Precision("fp32", cpu, sharded=False).scaler is None
    assert Precision("bf16", cpu, sharded=False).scaler is None
    assert Precision("fp16", cpu, sharded=False).scaler is not None
