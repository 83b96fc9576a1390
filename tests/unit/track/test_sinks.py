"""``Trackers``: events come from the training thread and from the checkpoint store's background
threads; a sink that fails while the trackers close from another thread must not raise, and a
call after ``close`` reaches no sink."""

from __future__ import annotations

import threading
from typing import Any

from hpcpipe.track.sinks import Trackers


class _Recording:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.closed = False

    def on_row(self, row: dict[str, Any]) -> None:
        self.calls.append("row")

    def on_event(self, kind: str, fields: dict[str, Any]) -> None:
        if self.closed:
            raise RuntimeError("the writer is closed")
        self.calls.append(kind)

    def close(self, finished: bool) -> None:
        self.closed = True


class _FailsWhenReleased(_Recording):
    """Fails on an event, once the test releases it (the writer closed meanwhile, say)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def on_event(self, kind: str, fields: dict[str, Any]) -> None:
        self.entered.set()
        self.release.wait(timeout=10)
        raise RuntimeError("the writer is closed")


def test_an_event_after_close_reaches_no_sink() -> None:
    sink = _Recording()
    trackers = Trackers([sink])
    trackers.on_event("checkpoint_saved", {"step": 3})
    trackers.close(finished=True)
    trackers.on_event("checkpoint_verified", {"step": 3})  # the store's thread, after the trainer closed
    assert sink.calls == ["checkpoint_saved"] and sink.closed


def test_close_waits_for_an_event_in_flight_and_a_sink_failing_in_it_raises_nothing() -> None:
    failing, other = _FailsWhenReleased(), _Recording()
    trackers = Trackers([failing, other])
    errors: list[BaseException] = []

    def verify() -> None:  # the checkpoint store's after-commit thread
        try:
            trackers.on_event("checkpoint_verified", {"step": 6})
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=verify)
    thread.start()
    assert failing.entered.wait(timeout=10)
    closer = threading.Thread(target=trackers.close, args=(True,))
    closer.start()
    closer.join(timeout=0.3)
    assert not other.closed  # the trainer's close waits for the event's calls to finish
    failing.release.set()
    thread.join(timeout=10)
    closer.join(timeout=10)
    assert errors == []  # before, the failed sink's removal from the closed list raised here
    assert other.calls == ["checkpoint_verified"] and other.closed and not failing.closed  # dropped
    assert trackers.sinks == []
