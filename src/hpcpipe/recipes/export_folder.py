"""The folder an export is written to: staged inside it, then put in place of what the earlier
export there wrote, and of nothing else.

Another format's files left beside a new export (an hf ``config.json`` beside hpcpipe's
safetensors) loaded as a model of random weights; replacing the whole folder deleted what a
user kept there (a run, notes). So every export lists what it wrote in ``.hpcpipe-export`` and
the next one replaces exactly those entries; anything else in the folder makes it refuse. The
folder is never renamed (``--out .`` or a mount point cannot be) and nothing is written beside
it; a lock file in the folder keeps two exports from interleaving (and, taken shared, a reader
from seeing one mid-move: ``checkpoint/export_record.py``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hpcpipe.checkpoint.export_record import ADAPTER_COMPANIONS, LOCK, MARKER, PARTIAL, locked, runs_own
from hpcpipe.checkpoint.manifest import CheckpointError
from hpcpipe.layout import RunLayout


@contextlib.contextmanager
def export_folder(
    out: Path,
    record: dict[str, Any],
    keep_out_of: Sequence[Path],
    flag: str | None = "--out",
    wait_s: float = 0.0,
) -> Iterator[Path]:
    """A staging folder inside ``out`` to write the export to; on success its entries replace
    those of the earlier export in ``out``. ``keep_out_of``: folders (the checkpoint, its run)
    that must not lie inside ``out``. ``flag``: the option that named ``out``, for messages (None:
    no option did, the training's adapter). ``wait_s``: how long to wait for another export or a
    register using ``out`` (0: refuse at once)."""
    out = out.resolve()
    where = f"{flag} {out}" if flag else str(out)
    if out.exists() and not out.is_dir():  # the CLI's one line; a failed step to the pipeline
        raise NotADirectoryError(errno.ENOTDIR, "Not a directory", str(out))
    for kept in keep_out_of:
        if kept.resolve().is_relative_to(out):
            raise CheckpointError(f"{where}: holds {kept}, which an export must not touch; export elsewhere")
    out.mkdir(parents=True, exist_ok=True)
    if not (out / MARKER).exists() and not runs_own(out):
        # A folder of the user's: refused before the lock leaves its file there (again under it).
        _earlier_export(out, where, flag is not None)
    with _locked(out, where, wait_s):
        earlier = _earlier_export(out, where, flag is not None)
        for stale in out.glob(f"{PARTIAL}*"):  # under the lock: left by a killed export
            shutil.rmtree(stale, ignore_errors=True)
        staging = out / f"{PARTIAL}{os.getpid()}"
        staging.mkdir()
        try:
            yield staging
            _put_in_place(staging, out, earlier, record)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _locked(out: Path, where: str, wait_s: float) -> contextlib.AbstractContextManager[None]:
    busy = f"{where}: another export is writing there now (or a register reading it)"
    if wait_s:
        busy = f"{where}: still in use by another export or a register after {wait_s:g} s; not written"
    return locked(out, exclusive=True, busy=busy, wait_s=wait_s)


def _earlier_export(out: Path, where: str, chosen: bool) -> set[str]:
    """The entries of ``out`` the earlier export wrote (it is empty, or holds only those). Beside
    the run's adapter, what other commands wrote for it stays (their files record the weights
    they were set on). ``chosen``: the user chose ``out`` (and may choose another)."""
    held = {p.name for p in out.iterdir() if not p.name.startswith(PARTIAL) and p.name not in (MARKER, LOCK)}
    if out.name == RunLayout.ADAPTER and runs_own(out):
        held -= set(ADAPTER_COMPANIONS)
    if not held:
        return set()
    listed = _listed(out / MARKER)
    if listed is None and runs_own(out):  # written before the marker existed
        return held
    foreign = sorted(held - (listed or set()))
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        fix = "choose an empty or new directory" if chosen else "move them out of it"
        raise CheckpointError(f"{where}: holds what no hpcpipe export there wrote ({shown}); {fix}")
    return held


def _listed(marker: Path) -> set[str] | None:
    """What the marker lists; None without one. A marker without a list (written on 2026-12-05
    before lists) was written with a folder that held nothing else: every entry is listed."""
    if not marker.is_file():
        return None
    try:
        files = json.loads(marker.read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return set()
    if files is None:
        return {p.name for p in marker.parent.iterdir()}
    return {str(name) for name in files} if isinstance(files, list) else set()


def _put_in_place(staging: Path, out: Path, earlier: set[str], record: dict[str, Any]) -> None:
    """The earlier export's entries out, the staged ones in, the marker last: an interrupted
    move leaves a marker listing what the next export may replace."""
    written = sorted(p.name for p in staging.iterdir())
    (out / MARKER).write_text(json.dumps({**record, "files": sorted(set(written) | earlier)}) + "\n")
    for name in earlier:
        path = out / name
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
    for name in written:
        (staging / name).rename(out / name)
    (out / MARKER).write_text(json.dumps({**record, "files": written}) + "\n")
