"""`hpcpipe track sync`'s decisions, against a stand-in server: which values to send, with which
timestamps, and the run's final status."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from hpcpipe.track.mlflow_run import metric_values
from hpcpipe.track.sync import _missing_values, _with_times, final_status


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


def test_an_evaluation_without_a_time_takes_the_training_rows_not_the_syncs() -> None:
    """Evaluation rows had no ``time``: every val_loss in MLflow carried the moment of the sync."""
    rows = [
        {"step": 0, "val_loss": 5.0},  # before any training row: the first one's
        {"step": 5, "loss": 2.0, "time": 100.0},
        {"step": 10, "loss": 1.0, "time": 200.0},
        {"step": 10, "val_loss": 4.0},
        {"step": 15, "val_loss": 3.5},  # between logged rows: the one before
        {"step": 20, "val_loss": 3.0, "time": 250.0},  # its own
    ]
    stamps = [(v[0], v[3], v[2]) for row in _with_times(rows) for v in metric_values(row)]
    assert stamps == [
        ("val_loss", 0, 100000),
        ("loss", 5, 100000),
        ("loss", 10, 200000),
        ("val_loss", 10, 200000),
        ("val_loss", 15, 200000),
        ("val_loss", 20, 250000),
    ]


def _events(*kinds: str) -> list[dict[str, Any]]:
    return [{"event": kind, "time": float(n)} for n, kind in enumerate(kinds, start=1)]


def test_the_status_is_the_one_the_last_start_ended_with() -> None:
    """Sync only ever set FINISHED: a preempted run stayed FAILED (or RUNNING, when the server was
    unreachable at close, after a resume had marked it RUNNING)."""
    assert final_status(_events("group_start", "preempted"), finished=False) == ("KILLED", 2000)
    assert final_status(_events("group_start", "pruned", "checkpoint_verified"), False) == ("KILLED", 2000)
    assert final_status(_events("group_start", "hang"), finished=False) == ("FAILED", 2000)
    ended = _events("group_start", "preempted", "group_start", "resumed", "run_finished")
    assert final_status(ended, finished=True) == ("FINISHED", 5000)
    # The last start wrote no ending yet: training, or crashed; its status is left as it is.
    assert final_status(_events("group_start", "preempted", "group_start"), False) == (None, None)
    assert final_status([], finished=False) == (None, None)
    # The finish of an earlier, shorter run (the run now trains to more steps) is not this one's.
    assert final_status(_events("group_start", "run_finished"), finished=False) == (None, None)


def test_an_infinite_value_the_sql_store_keeps_as_float_max_is_not_sent_again() -> None:
    """MLflow's SQL store saves +-inf as +-1.7976931348623157e308: every sync sent it again."""
    top = 1.7976931348623157e308
    server = _History(grad_norm=[(1, top, 1000)], loss=[(1, -top, 1000)], lr=[(1, top, 1000)])
    rows = [{"step": 1, "grad_norm": math.inf, "loss": -math.inf, "lr": -math.inf, "time": 1.0}]
    assert _missing_values(server, "r", rows) == [("lr", -math.inf, 1001, 1)]  # the other sign
