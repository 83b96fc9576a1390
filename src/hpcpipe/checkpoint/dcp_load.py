"""Load a DCP checkpoint into a model and optimizer, verifying every file as it is read.

One collective call per restore attempt (``load_verified``): a checkpoint of the destination's
own layout is read without DCP's load planner (``same_layout.py``), any other through DCP. A
file that does not match the manifest on any rank makes every rank raise ``CorruptCheckpoint``
with all ranks' problems (DCP gathers each rank's read errors to all ranks; the same-layout path
gathers them itself), so the store can fall back together.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpcpipe.checkpoint import same_layout
from hpcpipe.checkpoint.manifest import CheckpointError, FileMismatch, Manifest, Problem
from hpcpipe.checkpoint.raw_format import TENSOR_FORMAT
from hpcpipe.checkpoint.safe_dcp import SafeFileSystemReader, SafeLoadPlanner
from hpcpipe.checkpoint.save_errors import first_failure

__all__ = ["CorruptCheckpoint", "load_verified"]

log = logging.getLogger("hpcpipe.checkpoint")


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
    import dataclasses

    from torch.distributed.checkpoint.state_dict import (
        get_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    reader = SafeFileSystemReader(path, manifest, sources, threads)
    never_saved, set_aside = _set_aside_state_never_saved(optim_sd, reader)
    if not _load_same_layout(path, manifest, state, reader, group, threads):
        _load_through_dcp(path, state, reader, group)
    state["optim"].get("state", state["optim"]).update(set_aside)  # the fresh state, loaded, then dropped
    set_model_state_dict(model, state["model"], options=options)
    # Not strict: an optimizer that has taken steps has no state for such a parameter either
    # (torch then refuses the checkpoint's lack of it). Every state the checkpoint holds was
    # loaded above, or the load failed.
    set_optimizer_state_dict(
        model, optimizer, state["optim"], options=dataclasses.replace(options, strict=False)
    )
    _forget_optimizer_state(model, optimizer, never_saved)
    return reader


def _set_aside_state_never_saved(
    optim_sd: dict[str, Any], reader: SafeFileSystemReader
) -> tuple[set[str], dict[str, Any]]:
    """Take out of ``optim_sd`` the parameters of which the checkpoint holds no optimizer state
    at all: their names, and the entries taken out. They had no gradient before it was saved (a
    head the loss does not use, an expert no token reached), so the optimizer had no state for
    them, while the fresh optimizer here has state for every parameter: a strict load refused
    every such run's checkpoints (tests/e2e/test_recipe_check.py, the unused head). A parameter
    with only some of its state saved still fails the load."""
    try:
        saved = reader.read_metadata().state_dict_metadata
    except Exception:  # the load below reports unreadable metadata, as it always has
        return set(), {}
    flat = "state" not in optim_sd  # flatten_optimizer_state_dict: "state.<fqn>.<key>" keys
    entries = optim_sd if flat else optim_sd["state"]
    fqn_of = {key: key[len("state.") :].rsplit(".", 1)[0] for key in entries if key.startswith("state.")}
    params = set(fqn_of.values()) if flat else set(entries)
    found: set[str] = set()
    for key in saved:
        rest = key[len("optim.state.") :] if key.startswith("optim.state.") else ""
        while "." in rest and rest not in params:
            rest = rest.rsplit(".", 1)[0]
        found.add(rest)
    never_saved = params - found
    taken = [key for key, fqn in fqn_of.items() if fqn in never_saved] if flat else list(never_saved)
    return never_saved, {key: entries.pop(key) for key in taken}


# Module names the wrappers add to a parameter's name that DCP's names leave out (DDP, compile,
# activation checkpointing).
_WRAPPER_NAMES = frozenset({"module", "_orig_mod", "_checkpoint_wrapped_module"})


def _forget_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, names: set[str]) -> None:
    """The parameters the checkpoint has no optimizer state for get none, as in the run that
    saved it: the optimizer creates it at their first gradient (the fresh state loaded for them
    has taken a step, and Adam's bias correction would count it)."""
    if not names:
        return
    for name, param in model.named_parameters():
        if ".".join(part for part in name.split(".") if part not in _WRAPPER_NAMES) in names:
            optimizer.state.pop(param, None)


def _load_through_dcp(
    path: Path, state: dict[str, Any], reader: SafeFileSystemReader, group: dict[str, Any]
) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

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


def _load_same_layout(
    path: Path,
    manifest: Manifest,
    state: dict[str, Any],
    reader: SafeFileSystemReader,
    group: dict[str, Any],
    threads: int,
) -> bool:
    """Load ``state`` without DCP's planner (``same_layout.py``) when every rank's state has the
    checkpoint's layout; False (nothing read) when any rank's differs, or its metadata does not
    read: DCP's path then, which reports a refusal as it always has. Collective over ``group``."""
    if manifest.tensor_format != TENSOR_FORMAT:
        return False
    pg = group.get("process_group")
    try:
        found = same_layout.plan(reader.read_metadata(), state)
    except CheckpointError:  # DCP's path reports it, as it always has
        found = None
    except Exception:  # a bug here must not leave the other ranks waiting: DCP's path then
        log.warning("same-layout restore of %s not planned; loading through DCP", path, exc_info=True)
        found = None
    if not all(_all_gather(found is not None, pg)):
        return False
    assert found is not None
    problem: Problem | None = None
    error: Exception | None = None
    try:
        same_layout.load(reader, found, state, threads)
    except FileMismatch as exc:
        problem = exc.problem
    except Exception as exc:  # every rank must learn of it, or the others would wait for this one
        error = exc
    outcomes = _all_gather((problem, None if error is None else f"{type(error).__name__}: {error}"), pg)
    problems = sorted({p for p, _ in outcomes if p is not None}, key=lambda p: p.file)
    if problems:
        raise CorruptCheckpoint(path, problems)
    if error is not None:
        raise error
    failed = next((message for _, message in outcomes if message), None)
    if failed is not None:
        raise CheckpointError(f"{path}: the load failed on another rank ({failed})")
    return True


def _all_gather(value: Any, pg: Any) -> list[Any]:
    if pg is None:
        return [value]
    import torch.distributed as dist

    found: list[Any] = [None] * dist.get_world_size(pg)
    dist.all_gather_object(found, value, group=pg)
    return found


def _mismatches(exc: BaseException) -> list[Problem]:
    """Every rank's FileMismatch inside DCP's CheckpointException (failures: rank -> (exc, tb))."""
    failures = getattr(exc, "failures", None) or {}
    found = [failure[0] for _, failure in sorted(failures.items())]
    problems = {e.problem for e in found if isinstance(e, FileMismatch)}
    return sorted(problems, key=lambda p: p.file)
