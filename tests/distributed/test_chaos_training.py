"""The shipped chaos scenarios that fault a running group, one seeded trial each, end to end:
real `hpcpipe train` jobs on 2 gloo ranks (and two local agents for the lost node). The checks
are the scenarios' own (bitwise or tolerance resume against a reference run, events, exit codes);
`hpcpipe chaos run shipped --trials 50` is the same at scale."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers import run_shipped_chaos

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(1500)]


def test_training_faults_recover(tmp_path: Path) -> None:
    names = (
        "kill-a-rank",
        "always-failing-rank",
        "oom-on-one-rank",
        "stalled-rank",
        "slow-rank",
        "lost-node",
    )
    rows = run_shipped_chaos(tmp_path / "chaos", *names, timeout=1400)
    by_name = {r["scenario"]: r for r in rows}
    assert by_name["lost-node"]["ttr_s"] is not None and by_name["kill-a-rank"]["lost"] == 0
