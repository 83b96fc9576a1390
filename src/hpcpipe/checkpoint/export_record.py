"""What marks an export folder finished, for its writer (``recipes/export_folder.py``) and its
readers (``track/registry.py``).

An export is staged in ``.partial-<pid>`` inside its folder, then moved in place under an
exclusive ``flock`` on the folder, and ``.hpcpipe-export`` lists what it wrote. A reader that
takes the lock shared sees no export mid-move; one killed mid-move leaves a listed file missing
or a staging folder holding what was never moved, and then the folder holds no finished export.
A file system without ``flock`` (Lustre mounted without it, some NFS) gives no lock: the export
or the reading goes on unlocked, with one line saying so.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hpcpipe.checkpoint.manifest import CheckpointError

MARKER = ".hpcpipe-export"  # {"files": [what the export wrote], "checkpoint": ..., "format": ...}
PARTIAL = ".partial-"  # an export being written (or one a killed process left)
# flock's answers where the file system has no locks (Lustre without -o flock: ENOSYS; NFS
# without lockd: ENOLCK, EBADF on a read-only descriptor; others EOPNOTSUPP).
_NO_LOCKS = {errno.ENOSYS, errno.ENOLCK, errno.EBADF, errno.EOPNOTSUPP}
log = logging.getLogger("hpcpipe.checkpoint")


@contextlib.contextmanager
def locked(folder: Path, exclusive: bool, busy: str) -> Iterator[None]:
    """``flock`` on ``folder`` (exclusive for an export, shared for a reader) while the block
    runs; CheckpointError ``busy`` when another holds it, unlocked where the file system has none."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CheckpointError(busy) from None
        except OSError as exc:
            if exc.errno not in _NO_LOCKS:
                raise
            log.warning("%s: no file locks here (%s); going on unlocked", folder, os.strerror(exc.errno))
        yield
    finally:
        os.close(fd)  # releases the lock


def reading(folder: Path) -> contextlib.AbstractContextManager[None]:
    """A shared lock on ``folder`` for as long as it is read: no export moves files in meanwhile."""
    return locked(folder, exclusive=False, busy=f"{folder}: an export is writing there now; try once it ends")


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


def finished_files(folder: Path) -> list[str]:
    """The entries of the finished export in ``folder``; one line naming it when it holds none.
    Call it under ``reading(folder)``."""
    record = export_record(folder)
    if record is None:
        raise CheckpointError(f"{folder}: not an hpcpipe export (no {MARKER}); use `hpcpipe ckpt export`")
    files = record.get("files")
    if files is None:  # a marker written before lists: the folder held nothing else
        files = [p.name for p in folder.iterdir() if p.name != MARKER and not p.name.startswith(PARTIAL)]
    if not isinstance(files, list) or not files:
        raise CheckpointError(f"{folder / MARKER}: lists no files; run the export again")
    names = sorted(str(name) for name in files)
    missing = [name for name in names if not (folder / name).exists()]
    staged = [p.name for p in folder.glob(f"{PARTIAL}*") if p.is_dir() and any(p.iterdir())]
    if missing or staged:  # killed while moving its files in (or, staged only, while writing)
        why = f"{missing[0]} is missing" if missing else f"{staged[0]} was never moved in"
        raise CheckpointError(f"{folder}: its export did not finish ({why}); run the export again")
    return names
