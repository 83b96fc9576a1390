"""Load a DCP checkpoint into a model and optimizer, verifying every file as it is read.

One collective call per restore attempt (``load_verified``). A file that does not match the
manifest on any rank makes every rank raise ``CorruptCheckpoint`` with all ranks' problems
(DCP gathers each rank's read errors to all ranks), so the store can fall back together.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpcpipe.checkpoint.manifest import CheckpointError, FileMismatch, Manifest, Problem
from hpcpipe.checkpoint.safe_dcp import SafeFileSystemReader, SafeLoadPlanner
from hpcpipe.checkpoint.save_errors import first_failure

__all__ = ["CorruptCheckpoint", "load_verified"]


class CorruptCheckpoint(CheckpointError):
    """Files of one checkpoint did not match its manifest when read (raised on every rank)."""

    def __init__(self, path: Path, problems: list[Problem]) -> None:
        super().__init__(f"{path}/{problems[0]}")
        self.path = path
        self.problems = problems


def load_verified(
    path: Path,
    manifest: Manifest,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    options: Any,
    group: dict[str, Any],
    sources: Sequence[Path] = (),
    threads: int = 2,
) -> SafeFileSystemReader:
    """Load ``path`` into ``model``/``optimizer`` (collective over ``group``); the reader used.

    ``options``: DCP's ``StateDictOptions``; ``group``: ``process_group=`` or ``no_dist=True``;
    ``sources``: copies tried first (the memory tier). CorruptCheckpoint when a file differs
    from the manifest; CheckpointError when the checkpoint does not fit the model.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    reader = SafeFileSystemReader(path, manifest, sources, threads)
    try:
        dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(), **group)
    except FileMismatch as exc:  # one process: DCP may raise the reader's error as it is
        raise CorruptCheckpoint(path, [exc.problem]) from None
    except CheckpointException as exc:
        problems = _mismatches(exc)
        if problems:
            raise CorruptCheckpoint(path, problems) from None
        if isinstance(reader.refused, FileMismatch):
            raise CorruptCheckpoint(path, [reader.refused.problem]) from None
        if reader.refused is not None:
            raise reader.refused from None
        raise CheckpointError(f"{path}: does not load into this model ({first_failure(exc)})") from None
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=options
    )
    return reader


def _mismatches(exc: BaseException) -> list[Problem]:
    """Every rank's FileMismatch inside DCP's CheckpointException (failures: rank -> (exc, tb))."""
    failures = getattr(exc, "failures", None) or {}
    found = [failure[0] for _, failure in sorted(failures.items())]
    problems = {e.problem for e in found if isinstance(e, FileMismatch)}
    return sorted(problems, key=lambda p: p.file)
