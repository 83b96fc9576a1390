"""The check's work directory, which a check may reuse only from a previous check.

A check's runs have fixed names: given the same ``--work`` again, the next check resumed the
earlier runs instead of training (a finished run trained nothing, so properties passed on stale
results; one whose settings changed refused to start), and the earlier kill marker held the kill
back. So each check starts on an empty directory: it removes what a previous check wrote (the
names its record lists) and refuses a directory holding anything else, which may be the user's.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from hpcpipe.errors import UserError

RECORD = ".hpcpipe-check"  # the names a check wrote into its work directory, one a line


def claim(root: Path) -> None:
    """``root`` created, or emptied of a previous check's files; UserError naming ``--work``
    when it holds anything its record does not list."""
    root.mkdir(parents=True, exist_ok=True)
    present = sorted(p.name for p in root.iterdir() if p.name != RECORD)
    if not present:
        return
    record = root / RECORD
    if not record.is_file():
        raise UserError(
            f"--work {root}: holds {present[0]} and is not a previous check's work directory: give an "
            "empty or new directory (a check removes only what an earlier check wrote there)"
        )
    written = set(record.read_text().splitlines())
    strangers = [name for name in present if name not in written]
    if strangers:
        raise UserError(
            f"--work {root}: {strangers[0]} was not written by the previous check there ({RECORD} does "
            "not list it): remove it, or give an empty or new directory"
        )
    for name in present:
        _remove(root / name)
    print(f"note: --work {root}: removed the previous check's {', '.join(present)}", file=sys.stderr)


def refuse_config_inside(root: Path, config: Path) -> None:
    """UserError naming ``--config`` when that file lies in ``root``: the check would remove it
    (a previous check's ``job.yaml``, say) or refuse the directory, and writes its own there."""
    if config.resolve().is_relative_to(root.resolve()):
        raise UserError(
            f"--config {config}: lies in --work {root}, which the check empties and writes its own "
            "job.yaml into: copy it out of there first, or give another --work"
        )


def record(root: Path) -> None:
    """List what the check wrote in ``root`` (all of it: ``claim`` left it empty), for the next."""
    names = sorted(p.name for p in root.iterdir() if p.name != RECORD)
    (root / RECORD).write_text("".join(f"{name}\n" for name in names))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
