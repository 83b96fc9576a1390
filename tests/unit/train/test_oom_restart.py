"""train/oom_restart.py: the halved split an unrecoverable OOM leaves for the agent's restart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcpipe.errors import ConfigError
from hpcpipe.train.oom import OOMGuard
from hpcpipe.train.oom_restart import remember_halved_split, take_remembered_split


def test_the_restart_takes_the_halved_split_once(tmp_path: Path) -> None:
    path = tmp_path / "oom_restart_split.json"
    remember_halved_split(OOMGuard(8, 1), path)
    assert json.loads(path.read_text()) == {"configured": [8, 1], "micro_batch_size": 4, "accum_steps": 2}
    guard = OOMGuard(8, 1)
    taken = take_remembered_split(guard, path, None)
    assert taken == {
        "old_micro_batch_size": 8,
        "old_accum_steps": 1,
        "new_micro_batch_size": 4,
        "new_accum_steps": 2,
    }
    assert (guard.micro_batch_size, guard.accum_steps) == (4, 2) and not path.exists()
    assert take_remembered_split(OOMGuard(8, 1), path, None) is None  # taken once


def test_a_checkpoint_split_larger_than_the_one_that_ran_out_is_halved_from_the_hint(tmp_path: Path) -> None:
    """The in-process recovery had halved 8 -> 4 after the last checkpoint (which holds 8); the
    unrecoverable OOM then hit at 4: the restart trains at 2."""
    path = tmp_path / "split.json"
    ran_out = OOMGuard(8, 1)
    ran_out.shrink()
    remember_halved_split(ran_out, path)
    guard = OOMGuard(8, 1)
    assert take_remembered_split(guard, path, None) is not None
    assert (guard.micro_batch_size, guard.accum_steps) == (2, 4)


def test_a_split_the_config_changed_since_is_not_taken(tmp_path: Path) -> None:
    path = tmp_path / "split.json"
    remember_halved_split(OOMGuard(8, 1), path)
    guard = OOMGuard(4, 2)  # the user lowered train.micro_batch_size after the exit
    assert take_remembered_split(guard, path, None) is None
    assert (guard.micro_batch_size, guard.accum_steps) == (4, 2) and not path.exists()


@pytest.mark.parametrize("micro", [1, 3])
def test_a_micro_batch_that_cannot_be_halved_names_the_key(tmp_path: Path, micro: int) -> None:
    with pytest.raises(ConfigError, match=r"^train\.micro_batch_size: out of memory"):
        remember_halved_split(OOMGuard(micro, 1), tmp_path / "split.json")
    assert not (tmp_path / "split.json").exists()
