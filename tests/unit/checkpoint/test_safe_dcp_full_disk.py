"""A full disk inside a DCP save: the save fails (never half-committed) and no writer-thread
traceback reaches the user, whichever file (a shard in an extra writer thread, or .metadata in
the saving thread) hit it."""

from __future__ import annotations

import errno
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from hpcpipe.checkpoint import safe_dcp
from hpcpipe.checkpoint.safe_dcp import HashedFileSystemWriter


def _full_disk_on(monkeypatch: pytest.MonkeyPatch, name_part: str) -> None:
    real_write = safe_dcp._HashingStream.write

    def write(self: Any, data: Any) -> int:
        if name_part in self._path.name:
            raise OSError(errno.ENOSPC, "No space left on device")
        return int(real_write(self, data))

    monkeypatch.setattr(safe_dcp._HashingStream, "write", write)


def _save(tmp_path: Path) -> None:
    state = {f"w{i}": torch.randn(64, 64) for i in range(8)}
    writer = HashedFileSystemWriter(tmp_path / "ckpt", "extra.bin", b"x", thread_count=2)
    dcp.save(state, storage_writer=writer)


@pytest.mark.parametrize("name_part", [".metadata", "distcp"])
def test_a_full_disk_fails_the_save_without_a_thread_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name_part: str
) -> None:
    escaped: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: escaped.append(args.exc_value))
    _full_disk_on(monkeypatch, name_part)
    with pytest.raises(dcp.api.CheckpointException) as failed:
        _save(tmp_path)
    ((error, _stack),) = failed.value.failures.values()  # rank -> (what failed there, where)
    assert isinstance(error, OSError) and error.errno == errno.ENOSPC
    assert escaped == []  # nothing escaped a writer thread (Python would print it)
