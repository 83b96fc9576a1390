"""`hpcpipe track sync`'s decisions, against a stand-in server: which values to send, with which
timestamps, and the run's final status."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from hpcpipe.track.sync import _missing_values


class _History:
    """A server's metric history: (step, value, timestamp ms) per key."""

    def __init__(self, **keys: list[tuple[int, float, int]]) -> None:
        self.keys = keys

    def get_metric_history(self, run_id: str, key: str) -> list[Any]:
        return [SimpleNamespace(step=s, value=v, timestamp=t) for s, v, t in self.keys.get(key, [])]


def test_the_run_directorys_value_replaces_a_discarded_one_on_the_server() -> None:
    """After a rollback resume the server held the discarded attempt's values at the re-trained
    steps (the sink could not send the new ones); compared by (key, step) only, sync sent nothing."""
    server = _History(
        loss=[(1, 3.0, 1000), (2, 2.5, 2000), (2, 9.9, 5000)],  # step 2: the discarded 9.9 is newest
        val_loss=[(2, math.nan, 2000)],
    )
    rows = [
        {"step": 1, "loss": 3.0, "time": 1.0},
        {"step": 2, "loss": 2.5, "time": 3.0},
        {"step": 2, "val_loss": math.nan, "time": 3.0},  # the same NaN: not sent again
        {"step": 3, "loss": 1.5, "time": 4.0},
    ]
    assert _missing_values(server, "r", rows) == [
        ("loss", 2.5, 5001, 2),  # after the server's newest at the step: the newest there now
        ("loss", 1.5, 4000, 3),
    ]
    server = _History(loss=[(1, 3.0, 1000), (2, 2.5, 3000), (3, 1.5, 4000)], val_loss=[(2, math.nan, 3000)])
    assert _missing_values(server, "r", rows) == []  # the second sync sends nothing
