"""What marks an export folder finished, for its writer (``recipes/export_folder.py``) and its
readers (``track/registry.py``).

An export is staged in ``.partial-<pid>`` inside its folder, then moved in place under an
exclusive ``flock`` on the folder's ``.hpcpipe-export.lock``, and ``.hpcpipe-export`` lists what
it wrote. A reader that takes the lock shared sees no export mid-move; one killed mid-move leaves
a listed file missing or a staging folder holding what was never moved, and then the folder
holds no finished export. The lock is a file opened read-write, not the folder: Linux NFS turns
``flock`` into a POSIX lock, which refuses an exclusive lock on a read-only descriptor (EBADF).
It stays in the folder (removing it would let two processes lock two files) and is no export's
file: never listed, uploaded or hashed. A file system without ``flock`` (Lustre mounted without
it, NFS without lockd) gives no lock: the export or the reading goes on unlocked, with one line
saying so.

The adapter a LoRA run writes at its end (``export/adapter``) is written the same way, its record
giving the ``step`` it was trained to; other commands later write ``ADAPTER_COMPANIONS`` beside it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hpcpipe.checkpoint.manifest import CheckpointError
from hpcpipe.layout import RunLayout

MARKER = ".hpcpipe-export"  # {"files": [what it wrote], "checkpoint" or "step": ..., "format": ...}
LOCK = ".hpcpipe-export.lock"  # what exports and readers lock (empty; no export's file)
PARTIAL = ".partial-"  # an export being written (or one a killed process left)
# Written into the run's adapter folder after the adapter, by other commands (not the export's).
ADAPTER_COMPANIONS = (RunLayout.CALL_THRESHOLD, RunLayout.DECLINE)
# flock's answers where the file system has no locks (Lustre without -o flock: ENOSYS; NFS
# without lockd: ENOLCK; others EOPNOTSUPP), or none for this file (EBADF: NFS refusing an
# exclusive lock on a file open read-only, as another user's lock file is: _open_lock).
_NO_LOCKS = {errno.ENOSYS, errno.ENOLCK, errno.EBADF, errno.EOPNOTSUPP}
# The lock file may not be opened so: a folder this user may only read, another user's file.
_NO_LOCK_FILE = {errno.EACCES, errno.EPERM, errno.EROFS}
log = logging.getLogger("hpcpipe.checkpoint")


@contextlib.contextmanager
def locked(folder: Path, exclusive: bool, busy: str, wait_s: float = 0.0) -> Iterator[None]:
    """``flock`` on ``folder``'s lock file (exclusive for an export, shared for a reader) while
    the block runs; CheckpointError ``busy`` when another holds it (still, after ``wait_s``
    seconds), unlocked where the file system has none."""
    fd = _open_lock(folder, exclusive)
    if fd is None:
        yield
        return
    try:
        _lock(fd, folder, exclusive, busy, wait_s)
        yield
    finally:
        os.close(fd)  # releases the lock


def _open_lock(folder: Path, exclusive: bool) -> int | None:
    """The lock file, created when missing; an export opens it read-write (NFS locks a file
    exclusively only so), or read-only when another user's file allows no more (flock needs no
    more), a reader read-only. None (one line) for a reader that may not create it."""
    path, denied = folder / LOCK, None
    for mode in (os.O_RDWR, os.O_RDONLY) if exclusive else (os.O_RDONLY,):
        try:
            return os.open(path, mode | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            if exc.errno not in _NO_LOCK_FILE:
                raise
            denied = exc
    assert denied is not None
    if exclusive:  # no lock file, and none may be made: nor may the export's files
        raise denied
    log.warning("%s: cannot create %s (%s); reading it unlocked", folder, LOCK, denied.strerror)
    return None


def _lock(fd: int, folder: Path, exclusive: bool, busy: str, wait_s: float) -> None:
    """Takes the lock, trying again for ``wait_s`` seconds (saying once that it waits)."""
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    deadline, said = time.monotonic() + wait_s, False
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CheckpointError(busy) from None
            if not said:
                log.warning("%s: in use by another export or a register; waiting up to %g s", folder, wait_s)
                said = True
            time.sleep(min(0.25, left))
        except OSError as exc:
            if exc.errno not in _NO_LOCKS:
                raise
            why = f"no file locks here ({os.strerror(exc.errno)})"
            if exclusive and exc.errno == errno.EBADF:
                why = f"{LOCK} is read-only to this user, and NFS locks only a writable file"
            log.warning("%s: %s; going on unlocked", folder, why)
            return


def reading(folder: Path) -> contextlib.AbstractContextManager[None]:
    """A shared lock on ``folder`` for as long as it is read: no export moves files in meanwhile."""
    return locked(folder, exclusive=False, busy=f"{folder}: an export is writing there now; try once it ends")


def runs_own(folder: Path, run_dir: Path | None = None) -> bool:
    """``folder`` is a folder of a run's own ``export/``: a default ``<step>-<format>`` folder or
    the training's adapter, which hpcpipe alone writes (so all it holds, without a record, was
    written by hpcpipe before records existed). The run is ``run_dir``, else the folder's
    grandparent when that holds a ``config.yaml``."""
    own = re.fullmatch(r"step-\d+-.+", folder.name) is not None or folder.name == RunLayout.ADAPTER
    if run_dir is not None:
        return own and folder.parent.resolve() == RunLayout(run_dir).export.resolve()
    return own and folder.parent.name == RunLayout.EXPORT and RunLayout(folder.parent.parent).config.is_file()


def export_record(folder: Path) -> dict[str, Any] | None:
    """The marker's record (``checkpoint``, ``format``, ``files``); None without a marker."""
    marker = folder / MARKER
    if not marker.is_file():
        return None
    try:
        record = json.loads(marker.read_text())
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict):
        raise CheckpointError(f"{marker}: not an export record (a JSON object); export again")
    return record


def finished_files(folder: Path, before_records: bool = False) -> list[str]:
    """The entries of the finished export in ``folder``; one line naming it when it holds none.
    ``before_records``: a folder without a record is one of the run's own written before records
    existed (``runs_own``), every entry its export's. Call it under ``reading(folder)``."""
    record = export_record(folder)
    if record is None and not before_records:
        raise CheckpointError(f"{folder}: not an hpcpipe export (no {MARKER}); use `hpcpipe ckpt export`")
    files = (record or {}).get("files")
    if files is None:  # no record, or one written before lists: the folder held nothing else
        files = [
            p.name
            for p in folder.iterdir()
            if p.name not in (MARKER, LOCK) and not p.name.startswith(PARTIAL)
        ]
    if not isinstance(files, list) or not files:
        where = f"{folder / MARKER}: lists no files" if record else f"{folder}: holds no export"
        raise CheckpointError(f"{where}; run the export again")
    names = sorted(str(name) for name in files)
    missing = [name for name in names if not (folder / name).exists()]
    staged = [p.name for p in folder.glob(f"{PARTIAL}*") if p.is_dir() and any(p.iterdir())]
    if missing or staged:  # killed while moving its files in (or, staged only, while writing)
        why = f"{missing[0]} is missing" if missing else f"{staged[0]} was never moved in"
        raise CheckpointError(f"{folder}: its export did not finish ({why}); run the export again")
    return names
