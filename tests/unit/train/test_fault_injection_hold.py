"""HPCPIPE_CHAOS_HOLD: a group smaller than the named world waits for a late node, until a group of
that size has started once (the lost-node scenario's first round on a loaded host)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcpipe.train import fault_injection as inject


@pytest.fixture(autouse=True)
def _no_faults_after() -> Iterator[None]:
    yield
    inject.configure({})


def test_a_smaller_group_waits_until_the_full_one_started(tmp_path: Path) -> None:
    inject.configure({"HPCPIPE_CHAOS_HOLD": "world=2", "HPCPIPE_CHAOS_DIR": str(tmp_path)})
    held = threading.Thread(target=inject.hold_until_world, args=(1, 0.01), daemon=True)
    held.start()
    held.join(0.3)
    assert held.is_alive()  # world 1 before any world-2 group: no step yet
    inject.hold_until_world(2)  # the late node joined: the full group goes on and releases the hold
    held.join(5)
    assert not held.is_alive()
    inject.hold_until_world(1)  # after a lost node: a smaller group is not held again


def test_without_the_variable_nothing_waits() -> None:
    inject.configure({})
    inject.hold_until_world(1)


@pytest.mark.parametrize(
    ("value", "needle"),
    [("world=1", "must be >= 2"), ("nodes=2", "expected 'world=N'"), ("world=two", "not an integer")],
)
def test_a_bad_hold_names_the_variable(tmp_path: Path, value: str, needle: str) -> None:
    with pytest.raises(inject.ChaosConfigError, match="HPCPIPE_CHAOS_HOLD") as caught:
        inject.configure({"HPCPIPE_CHAOS_HOLD": value, "HPCPIPE_CHAOS_DIR": str(tmp_path)})
    assert needle in str(caught.value)


def test_a_hold_needs_a_marker_directory() -> None:
    with pytest.raises(inject.ChaosConfigError, match="needs HPCPIPE_CHAOS_DIR"):
        inject.configure({"HPCPIPE_CHAOS_HOLD": "world=2"})
