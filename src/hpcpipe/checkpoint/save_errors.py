"""A failed checkpoint save as one line: what failed, where, and that older checkpoints are intact.

DCP wraps each rank's exception in a ``CheckpointException``; torch's zip writer reports a write
the filesystem cut short as a ``RuntimeError``. Both reach the store here, which finds the disk
error behind them (``disk_cause``) or says there is none (a bug, whose traceback is worth seeing).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from hpcpipe.checkpoint.manifest import CheckpointError


def disk_cause(exc: BaseException, tmp: Path) -> OSError | None:
    """The disk error behind a failed save into ``tmp`` (call before the temporary is removed:
    the space left tells a full disk), or None when the failure was not the disk."""
    return root_os_error(exc) or short_write(exc, tmp)


def save_error_message(step: int, tmp: Path, exc: BaseException) -> str:
    """One line: what failed, where (the file when known), and that older checkpoints are intact."""
    cause = root_os_error(exc)
    if cause is not None:
        where = cause.filename or tmp
        what = f"{cause.strerror or cause}: {where}"
    else:
        what = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return f"checkpoint save of step {step} failed ({what}); earlier checkpoints are intact"


# torch's zip writer reports a write the filesystem cut short (full, over quota, an I/O error) as
# RuntimeError "[enforce fail at inline_container.cc] unexpected pos N vs M", not as an OSError.
SHORT_WRITE = "unexpected pos"
NEARLY_FULL_BYTES = 16 << 20  # less free than one more chunk of a shard: the disk filled


def short_write(exc: BaseException, tmp: Path) -> OSError | None:
    """The OSError a short write in torch's zip writer stands for, or None if there was none."""
    if not any(SHORT_WRITE in str(e) for e in chain(exc)):
        return None
    try:
        stats = os.statvfs(tmp if tmp.exists() else tmp.parent)
        free = stats.f_bavail * stats.f_frsize
    except OSError:
        return OSError(errno.EIO, "a checkpoint write was cut short", str(tmp))
    if free < NEARLY_FULL_BYTES:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))
    return OSError(errno.EIO, f"a checkpoint write was cut short ({free >> 20} MiB free)", str(tmp))


def chain(exc: BaseException) -> list[BaseException]:
    """``exc``, every rank's failure inside a DCP CheckpointException, and their causes."""
    found = [exc]
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict):
        for _, (inner, _trace) in sorted(failures.items()):
            found += chain(inner)
    cause = exc.__cause__ or exc.__context__
    return found + (chain(cause) if cause is not None else [])


def first_failure(exc: BaseException) -> str:
    """The first line of the first rank's error inside a DCP CheckpointException."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = failures[min(failures)][0]
        if isinstance(inner, CheckpointError):
            raise inner
        text = str(inner).strip().splitlines()
        return f"{type(inner).__name__}: {text[0] if text else ''}"
    return str(exc).strip().splitlines()[0]


def root_os_error(exc: BaseException) -> OSError | None:
    """The OSError behind a DCP CheckpointException (which wraps each rank's exception)."""
    return next((e for e in chain(exc) if isinstance(e, OSError)), None)
