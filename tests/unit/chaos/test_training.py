"""The training scenarios' clocks."""

from __future__ import annotations

import json
from pathlib import Path

from hpcpipe.chaos.training import _first_step_began


def test_the_slow_rank_is_timed_from_its_first_slowed_step(tmp_path: Path) -> None:
    """Timed from the first logged row (step 10), the nine slowed steps before it were left out."""
    rows = [{"step": 0, "val_loss": 5.0}, {"step": 10, "loss": 4.0, "time": 100.0, "step_time_s": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _first_step_began(tmp_path) == 95.0
