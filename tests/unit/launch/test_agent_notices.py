"""The agent's quiet torch notices: the workers it stops after a failure are not news, a SIGKILL is."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from hpcpipe.launch.agent import _SIGNAL_NOTICES, _DropNotice, _quiet_signal_notices


@pytest.fixture(autouse=True)
def _filters_restored() -> Iterator[None]:
    """torch's loggers are process-wide: leave them with the filters they had."""
    loggers = [logging.getLogger(name) for name in _SIGNAL_NOTICES]
    before = [list(logger.filters) for logger in loggers]
    yield
    for logger, filters in zip(loggers, before, strict=True):
        logger.filters = filters


def _passes(logger: str, msg: str, *args: object) -> bool:
    record = logging.LogRecord(logger, logging.WARNING, __file__, 1, msg, args, None)
    return logging.getLogger(logger).filter(record)


@pytest.mark.parametrize(
    ("logger", "msg"),
    [
        ("torch.multiprocessing.spawn", "Terminating process %s via signal SIGTERM"),
        ("torch.distributed.elastic.multiprocessing.api", "Closing process %s via signal %s"),
        ("torch.distributed.elastic.agent.server.api", "Received %s death signal, shutting down workers"),
    ],
)
def test_the_stopping_of_the_other_workers_is_dropped(logger: str, msg: str) -> None:
    _quiet_signal_notices()
    _quiet_signal_notices()  # twice, as an agent run again in one process does: still one filter
    assert not _passes(logger, msg, 1234, "SIGTERM")
    drops = [f for f in logging.getLogger(logger).filters if isinstance(f, _DropNotice)]
    assert len(drops) == 1


def test_a_worker_killed_by_sigkill_is_still_reported() -> None:
    _quiet_signal_notices()
    msg = "Unable to shutdown process %s via SIGTERM , forcefully exiting via SIGKILL"
    assert _passes("torch.multiprocessing.spawn", msg, 1234)
    assert _passes("torch.multiprocessing.spawn", "Terminating process %s via signal SIGKILL", 1234)
