"""Which rank the agent names when a group fails: the one that failed, not its victims."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hpcpipe.launch.agent import _report_failure
from hpcpipe.launch.exit import PEER_LOST_EXIT_CODE, lost_a_peer

GLOO_PEER_GONE = (
    "[third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:2435. "
    "This is typically caused by a remote worker crashing."
)


def _failed(**codes: int) -> SimpleNamespace:
    failures = {
        int(r.removeprefix("r")): SimpleNamespace(exitcode=c, local_rank=0, pid=100) for r, c in codes.items()
    }
    return SimpleNamespace(failures=failures)


@pytest.mark.parametrize(
    ("codes", "named", "exit_code"),
    [
        ({"r0": PEER_LOST_EXIT_CODE, "r1": 1}, 1, 1),  # rank 1 raised; rank 0's all-reduce lost it
        ({"r0": PEER_LOST_EXIT_CODE, "r1": -9}, 1, 1),  # rank 1 SIGKILLed
        ({"r0": 3, "r1": 1}, 0, 3),  # two failures of their own: the lowest rank
        ({"r0": PEER_LOST_EXIT_CODE, "r1": PEER_LOST_EXIT_CODE}, 0, PEER_LOST_EXIT_CODE),
    ],
)
def test_the_rank_that_failed_is_named_before_its_victims(
    capsys: pytest.CaptureFixture[str], codes: dict[str, int], named: int, exit_code: int
) -> None:
    assert _report_failure(_failed(**codes), max_restarts=2) == exit_code
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"agent: worker rank {named} ") and "after 2 restart(s)" in line


def test_a_gloo_peer_loss_is_recognised() -> None:
    assert lost_a_peer(RuntimeError(GLOO_PEER_GONE))
    assert not lost_a_peer(RuntimeError("chaos: rank 1 fails at step 3 (HPCPIPE_CHAOS_FAIL)"))
