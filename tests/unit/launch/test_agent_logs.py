"""Where torch's elastic agent keeps its per-run logs: inside the launcher's exit directory."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.helpers import run_cli


def test_a_local_multi_rank_run_leaves_no_torchelastic_directory(tmp_path: Path) -> None:
    """Each run left a /tmp/torchelastic_* behind (thousands on a CI host)."""
    tmp = Path(tempfile.mkdtemp(prefix="hp-", dir="/tmp"))  # short: the fork server's socket lives there
    try:
        sets = ["--set", "train.steps=2", "--set", f"run.out_dir={tmp_path}/runs"]
        fresh = {
            "env": {"TMPDIR": str(tmp)},
            "prefix": [],
        }  # a fresh interpreter: the zygote's /tmp is cached
        proc = run_cli("train", "tiny", "--nproc", "2", *sets, cwd=tmp_path, **fresh)  # type: ignore[arg-type]
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert not list(tmp.glob("torchelastic_*")) and not list(tmp.glob("hpcpipe-exit-*"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_the_log_directory_is_under_the_exit_directory() -> None:
    code = (
        "from torch.distributed.launcher.api import LaunchConfig\n"
        "from hpcpipe.launch.agent import _logs_in_exit_dir\n"
        "from hpcpipe.launch.exit_dirs import exit_dir\n"
        "specs = _logs_in_exit_dir(LaunchConfig)['logs_specs']\n"
        "print(specs.root_log_dir.startswith(exit_dir()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "True"
