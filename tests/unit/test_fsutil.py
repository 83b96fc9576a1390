"""fsutil: a directory built in a temporary sibling is durable before it is renamed into place."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcpipe import fsutil


def test_every_file_is_fsynced_before_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A power loss after the rename left prepared function-calling data as empty files under a
    complete name (only the parent directory's entry was fsynced)."""
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    final = tmp_path / "prepared"
    with fsutil.atomic_replace_dir(final) as tmp:
        (tmp / "train.npz").write_bytes(b"x" * 10)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "eval.npz").write_bytes(b"y")
        built = str(tmp)
    assert f"{built}/train.npz" in synced and f"{built}/sub/eval.npz" in synced
    assert synced.index(f"{built}/sub/eval.npz") < synced.index(str(tmp_path))  # then the rename
    assert (final / "sub" / "eval.npz").read_bytes() == b"y"
