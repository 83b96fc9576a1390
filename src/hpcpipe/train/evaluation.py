"""Evaluation sums: the recipe's per-batch sums over this rank's batches, then over the ranks.

A recipe's ``eval_sums`` returns sums (a loss summed over tokens, a count), never means, so that
sums over batches and ranks give the exact metric however the data were split.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from hpcpipe.recipes.base import Batch, PaddingBatch, Recipe


def eval_sums(
    model: torch.nn.Module,
    recipe: Recipe,
    items: Iterable[Batch | PaddingBatch],
    autocast: Callable[[], contextlib.AbstractContextManager[Any]],
    to_device: Callable[[Batch], Batch],
) -> dict[str, torch.Tensor]:
    """float64 sums of ``recipe.eval_sums`` over ``items``; a padding batch (run for FSDP2's
    collectives only, on a rank with fewer batches) adds zeros."""
    sums: dict[str, torch.Tensor] = {}
    for item in items:
        padding = isinstance(item, PaddingBatch)
        batch = item.batch if isinstance(item, PaddingBatch) else item
        with autocast():
            batch_sums = recipe.eval_sums(model, to_device(batch))
        for key, value in batch_sums.items():
            add = torch.zeros_like(value, dtype=torch.float64) if padding else value.double()
            sums[key] = sums[key] + add if key in sums else add
    return sums


def summed_over_ranks(sums: dict[str, torch.Tensor], group: Any, ranks: int) -> dict[str, float]:
    """Each sum over the ``ranks`` of ``group`` (every rank holds the same keys: one recipe)."""
    keys = sorted(sums)
    totals = torch.stack([sums[k].reshape(()) for k in keys])  # (K,) this rank's sums
    if ranks > 1:
        dist.all_reduce(totals, group=group)
    return dict(zip(keys, totals.tolist(), strict=True))
