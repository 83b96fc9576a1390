"""Rank 0's log line for a metrics row."""

from __future__ import annotations

from hpcpipe.observe.progress import format_row


def test_a_row_without_a_gradient_norm_says_n_a() -> None:
    """DeepSpeed ZeRO-0 measures none: formatting None raised TypeError and killed rank 0."""
    row = {"step": 1, "loss": 2.5, "lr": 1e-3, "grad_norm": None, "tokens_per_s": 1234.0, "mfu": None}
    assert format_row(row) == "loss 2.5000  lr 1.00e-03  gnorm n/a  tokens/s 1,234"


def test_a_measured_gradient_norm_shows_two_decimals() -> None:
    row = {"step": 1, "loss": 2.5, "lr": 1e-3, "grad_norm": 0.4567, "mfu": 0.25}
    assert format_row(row) == "loss 2.5000  lr 1.00e-03  gnorm 0.46  mfu 25.0%"
