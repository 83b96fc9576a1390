"""Checkpoint writes start the disk's writeback as they go, and still hash every byte."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from hpcpipe.checkpoint import safe_dcp


def test_writeback_starts_every_chunk_and_the_hash_covers_all_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, int]] = []
    real = os.posix_fadvise

    def spy(fd: int, offset: int, length: int, advice: int) -> None:
        calls.append((offset, advice))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", spy)
    monkeypatch.setattr(safe_dcp, "WRITEBACK_BYTES", 1 << 20)
    payload = os.urandom((5 << 20) + 123)
    path = tmp_path / "shard.distcp"
    with path.open("wb") as raw:
        stream = safe_dcp._HashingStream(raw, path)
        for offset in range(0, len(payload), 300_000):  # torch.save writes in pieces like these
            stream.write(payload[offset : offset + 300_000])
        stream.flush()
    entry = stream.entry()
    assert entry.size == len(payload) == path.stat().st_size
    assert entry.digest == hashlib.sha256(payload).hexdigest()
    assert entry.digest == hashlib.sha256(path.read_bytes()).hexdigest()
    offsets = [offset for offset, advice in calls if advice == os.POSIX_FADV_DONTNEED]
    # Once at least 1 MiB is pending: after 4 writes (1.2 MB), 8, 12 and 16; the last 0.4 MB
    # waits for the final fsync.
    assert offsets == [0, 1_200_000, 2_400_000, 3_600_000]
