"""File-system helpers: durability for dataset preparation and checkpoint commits; reading the
small JSON records of a run directory."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    """Make a directory entry (a created or renamed file) durable; a no-op where unsupported."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dirs(root: Path) -> None:
    """Make the entries of ``root`` and every directory under it durable (the files' own data
    the writer fsynced): a subdirectory's entries are not covered by its parent's fsync."""
    for folder, _, _ in os.walk(root, topdown=False):
        fsync_dir(Path(folder))


def fsync_tree(root: Path) -> None:
    """Make every file under ``root``, and the entries of its directories, durable: a directory
    renamed into place after a crash must not hold empty or partial files under a complete name."""
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(folder))


def machine_cache_dir() -> Path | None:
    """Where hpcpipe keeps what it built and every run on this machine may reuse (the pre-trained
    ``@tiny-llama``): ``$HPCPIPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/hpcpipe``, else
    ``~/.cache/hpcpipe``. ``HPCPIPE_CACHE_DIR=`` (empty) turns it off: None."""
    chosen = os.environ.get("HPCPIPE_CACHE_DIR")
    if chosen is not None:
        return Path(chosen).expanduser() if chosen else None
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "hpcpipe"


@contextlib.contextmanager
def atomic_replace_dir(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it becomes ``final`` with one rename.

    A reader therefore sees either no ``final`` or a complete one, also after a power loss (the
    files are fsynced before the rename); an interrupted build leaves only a ``.tmp-*`` directory.
    When another process committed ``final`` first, its copy wins.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    try:
        yield tmp
        fsync_tree(tmp)  # the contents first: the rename below is what readers trust
        try:
            os.replace(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
        fsync_dir(final.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text_replacing(path: Path, text: str) -> None:
    """Write ``path`` through a temporary file beside it: a reader never sees half of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def read_json_strict(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; a ValueError naming the file when it is not one (a JSON decode
    error alone says "line 1 column 2", not which of a run's files it was)."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise ValueError(f"{path}: not valid JSON ({exc.msg}, {where})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not valid JSON (not UTF-8 text)") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; empty when the file is absent, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
