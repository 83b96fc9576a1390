"""The training rate's interval: what it counts and what it leaves out."""

from __future__ import annotations

import pytest
import torch

from hpcpipe.observe import throughput
from hpcpipe.observe.throughput import ThroughputMeter


def test_a_checkpoint_save_is_left_out_of_the_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """The save's seconds were counted in the next interval: a third of the rate at that row, and
    `hpcpipe profile` called a compute-bound run host-bound."""
    clock = [100.0]
    monkeypatch.setattr(throughput.time, "perf_counter", lambda: clock[0])
    meter = ThroughputMeter(1000, "tokens", 1, None, torch.device("cpu"), "fp32", None)
    for _ in range(4):  # four steps of 0.5 s, a 3 s save after the second
        clock[0] += 0.5
        meter.add_step(0.1)
        if meter._steps == 2:
            clock[0] += 3.0
            meter.exclude(3.0)
    row = meter.read()
    assert row["step_time_s"] == pytest.approx(0.5) and row["tokens_per_s"] == pytest.approx(2000.0)
    assert row["data_time_s"] == pytest.approx(0.1)
