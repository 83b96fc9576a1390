"""``run_cli`` forks ``python -m hpcpipe`` from a pre-imported zygote (``tests/cli_zygote.py``): what a
test sees must be what a fresh interpreter gives, byte for byte."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.cli_zygote import _CLIENT, run_forked
from tests.helpers import run_cli


def _fresh(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "hpcpipe", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["--help"],  # rich sizes it from COLUMNS: the environment is the request's, not the zygote's
        ["presets", "list"],
        ["train", "nope"],  # exit 2, one line on stderr
        ["train", "my.yaml"],  # a relative path: read from the request's directory
    ],
)
def test_a_forked_run_matches_a_fresh_interpreter(args: list[str], tmp_path: Path) -> None:
    (tmp_path / "my.yaml").write_text("preset: tiny\ntrain: {steps: -1}\n")
    env = {**os.environ, "COLUMNS": "61", "PYTHONUNBUFFERED": "1", "HOME": str(tmp_path)}
    forked = run_forked(args, cwd=tmp_path, env=env, timeout=120)
    assert not _CLIENT["client"].needs_fresh(env)  # it was forked, not a fresh interpreter
    fresh = _fresh(args, tmp_path, env)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.args == fresh.args


def test_a_run_past_its_timeout_is_killed_and_the_next_run_works(tmp_path: Path) -> None:
    sets = [f"run.out_dir={tmp_path}", "train.steps=100000", "observe.progress=false"]
    with pytest.raises(subprocess.TimeoutExpired):
        run_cli("train", "tiny", *[a for s in sets for a in ("--set", s)], cwd=tmp_path, timeout=3)
    assert run_cli("--version").returncode == 0


def test_an_import_time_variable_gets_a_fresh_interpreter() -> None:
    run_cli("--version")  # the zygote exists
    client = _CLIENT["client"]
    same = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "40"}
    assert not client.needs_fresh(same)  # consoles are built per run
    for var in ("HF_HOME", "OMP_NUM_THREADS", "PYTHONHASHSEED", "PYTHONPATH"):
        assert client.needs_fresh({**same, var: "/elsewhere"}), var
    # Read when used, and set by hpcpipe itself in the test process (the elastic agent): forked.
    assert not client.needs_fresh(
        {**same, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "CUDA_VISIBLE_DEVICES": ""}
    )
