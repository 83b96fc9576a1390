"""Evaluation: when it is due, and its sums (the recipe's per-batch sums over this rank's batches,
then over the ranks).

A recipe's ``eval_sums`` returns sums (a loss summed over tokens, a count), never means, so that
sums over batches and ranks give the exact metric however the data were split.

An evaluation leaves the training's random streams as it found them (``streams_kept``): a resumed
run skips the evaluation its checkpoint step already logged, so one that drew from torch's
generator (a validation augmentation) would move the uninterrupted run's dropout masks but not
the resumed run's, and the two would no longer train bit for bit alike.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from hpcpipe.config import TrainConfig
from hpcpipe.observe.metrics import read_metrics
from hpcpipe.recipes.base import Batch, PaddingBatch, Recipe
from hpcpipe.train.oom import AllReduceMax, agree_any


def eval_sums(
    model: torch.nn.Module,
    recipe: Recipe,
    items: Iterable[Batch | PaddingBatch],
    autocast: Callable[[], contextlib.AbstractContextManager[Any]],
    to_device: Callable[[Batch], Batch],
    should_stop: Callable[[], bool] = lambda: False,
) -> dict[str, torch.Tensor] | None:
    """float64 sums of ``recipe.eval_sums`` over ``items``; a padding batch (run for FSDP2's
    collectives only, on a rank with fewer batches) adds zeros. None when ``should_stop``, asked
    after each batch (the same answer on every rank: every rank runs the same batches), says the
    ranks agreed to stop for a preemption."""
    sums: dict[str, torch.Tensor] = {}
    for item in items:
        padding = isinstance(item, PaddingBatch)
        batch = item.batch if isinstance(item, PaddingBatch) else item
        with autocast():
            batch_sums = recipe.eval_sums(model, to_device(batch))
        for key, value in batch_sums.items():
            add = torch.zeros_like(value, dtype=torch.float64) if padding else value.double()
            sums[key] = sums[key] + add if key in sums else add
        if should_stop():
            return None
    return sums


def summed_over_ranks(sums: dict[str, torch.Tensor], group: Any, ranks: int) -> dict[str, float]:
    """Each sum over the ``ranks`` of ``group`` (every rank holds the same keys: one recipe)."""
    keys = sorted(sums)
    totals = torch.stack([sums[k].reshape(()) for k in keys])  # (K,) this rank's sums
    if ranks > 1:
        dist.all_reduce(totals, group=group)
    return dict(zip(keys, totals.tolist(), strict=True))


@contextlib.contextmanager
def streams_kept(device: torch.device) -> Iterator[None]:
    """A block whose draws from torch's CPU generator (and ``device``'s), Python's ``random`` and
    NumPy's global generator are undone after it: the streams a checkpoint restores."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def is_evaluation_step(step: int, cfg: TrainConfig) -> bool:
    """An evaluation follows ``step``: every ``train.eval_every`` steps and at the last."""
    return step > 0 and (step == cfg.steps or (cfg.eval_every > 0 and step % cfg.eval_every == 0))


def next_eval_step(step: int, cfg: TrainConfig) -> int:
    """The step after ``step`` that the next evaluation follows."""
    if cfg.eval_every <= 0:
        return cfg.steps
    return min(cfg.steps, (step // cfg.eval_every + 1) * cfg.eval_every)


def evaluation_logged(run_dir: Path, step: int) -> bool:
    """metrics.jsonl holds ``step``'s ``val_loss`` row (rank 0's file)."""
    return any(int(row.get("step", -1)) == step and "val_loss" in row for row in read_metrics(run_dir))


def missed(step: int, cfg: TrainConfig, run_dir: Path, is_main: bool, agree_max: AllReduceMax | None) -> bool:
    """Resumed at an evaluation step whose evaluation never ran: the step's checkpoint comes
    before its evaluation, so a preemption there (the last step's too) or a crash during it
    left no ``val_loss`` row for the step (rank 0 reads metrics.jsonl; every rank agrees)."""
    if not is_evaluation_step(step, cfg):
        return False
    missing = is_main and not evaluation_logged(run_dir, step)
    return agree_any(int(missing), agree_max) > 0


def device_eval_batches(
    items: Iterable[Batch | PaddingBatch], to_device: Callable[[Batch], Batch]
) -> Iterator[tuple[Batch, bool]]:
    """Evaluation batches on the device, each with whether it counts (a padding batch does not)."""
    for item in items:
        batch = item.batch if isinstance(item, PaddingBatch) else item
        yield to_device(batch), not isinstance(item, PaddingBatch)
