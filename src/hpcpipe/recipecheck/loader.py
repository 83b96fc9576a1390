"""The loader's properties, in this process: the same (seed, step, rank) gives the same
micro-batches, a loader resumed from its state at a step boundary serves what an uninterrupted
one would, and the global batch of a step is the same at 1 and at 2 ranks (for a recipe whose data
order does not depend on the world size: ``Recipe.world_size_invariant_order``)."""

from __future__ import annotations

from typing import Any

import torch

from hpcpipe.config import JobConfig, grad_accum_steps
from hpcpipe.recipes.base import Batch, Recipe


def micro_batches(recipe: Recipe, rank: int, world_size: int, count: int, state: Any = None) -> list[Batch]:
    """The next ``count`` micro-batches of a fresh loader (resumed from ``state`` when given)."""
    loader = recipe.train_loader(rank, world_size)
    try:
        if state is not None:
            loader.load_state_dict(state)
        return [loader.next_microbatch() for _ in range(count)]
    finally:
        loader.close()


def same_batches(a: list[Batch], b: list[Batch]) -> str | None:
    """None when equal, tensor for tensor; else where they first differ."""
    if len(a) != len(b):
        return f"{len(a)} micro-batches against {len(b)}"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if len(x) != len(y):
            return f"micro-batch {i}: {len(x)} tensors against {len(y)}"
        for j, (s, t) in enumerate(zip(x, y, strict=True)):
            if s.shape != t.shape or not torch.equal(s, t):
                return f"micro-batch {i}, tensor {j} differs"
    return None


def check_repeatable(recipe: Recipe, job: JobConfig) -> str:
    """Two loaders from the same seed, rank 0 of 1: the same first two steps' micro-batches."""
    count = 2 * grad_accum_steps(job.train, 1)
    first = micro_batches(recipe, 0, 1, count)
    second = micro_batches(recipe, 0, 1, count)
    problem = same_batches(first, second)
    if problem:
        raise AssertionError(f"two loaders of the same seed differ: {problem}")
    return f"{count} micro-batches equal"


def check_resumable(recipe: Recipe, job: JobConfig) -> str:
    """A loader restored from the state saved after step 1 serves step 2 as the one that ran on."""
    accum = grad_accum_steps(job.train, 1)
    loader = recipe.train_loader(0, 1)
    try:
        for _ in range(accum):
            loader.next_microbatch()
        state = loader.state_dict()
        expected = [loader.next_microbatch() for _ in range(accum)]
    finally:
        loader.close()
    problem = same_batches(micro_batches(recipe, 0, 1, accum, state), expected)
    if problem:
        raise AssertionError(f"a loader resumed from its state after step 1 differs: {problem}")
    return "step 2 equal after a restore at step 1"


def check_world_sizes(recipe: Recipe, job: JobConfig) -> str:
    """Step 1's global batch, concatenated over ranks, is the same at 1 and 2 ranks."""
    one = _global_batch(recipe, job, 1)
    two = _global_batch(recipe, job, 2)
    problem = same_batches([one], [two])
    if problem:
        raise AssertionError(f"the global batch at 2 ranks differs from 1 rank's: {problem}")
    return f"{len(one[0])} samples of step 1 equal"


def _global_batch(recipe: Recipe, job: JobConfig, world_size: int) -> Batch:
    """Every rank's micro-batches of step 1, concatenated in rank order: (global batch, ...)."""
    accum = grad_accum_steps(job.train, world_size)
    parts = [b for rank in range(world_size) for b in micro_batches(recipe, rank, world_size, accum)]
    return tuple(torch.cat([p[i] for p in parts]) for i in range(len(parts[0])))
