"""The shipped chaos scenarios around checkpoints, one seeded trial each, end to end: a kill or
SIGTERM inside a save, a damaged newest checkpoint, and a full disk (a real small tmpfs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.helpers import run_shipped_chaos

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(1200)]


def test_checkpoint_faults_recover(tmp_path: Path) -> None:
    names = ("kill-during-save", "sigterm-during-save", "corrupt-newest-checkpoint")
    run_shipped_chaos(tmp_path / "chaos", *names, timeout=1100)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting the small tmpfs needs root (CI has it)")
def test_a_full_disk_is_one_line_and_keeps_older_checkpoints(tmp_path: Path) -> None:
    run_shipped_chaos(tmp_path / "chaos", "disk-full", timeout=600)
