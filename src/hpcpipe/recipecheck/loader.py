"""The loader's properties, in this process: the same (seed, step, rank) gives the same
micro-batches, a loader resumed from its state at a step boundary serves what an uninterrupted
one would, 2 ranks get other samples, and the global batch of a step is the same at 1 and at 2
ranks (for a recipe whose data order does not depend on the world size:
``Recipe.world_size_invariant_order``)."""

from __future__ import annotations

from typing import Any

import torch

from hpcpipe.config import JobConfig, grad_accum_steps
from hpcpipe.recipecheck.training import Skip
from hpcpipe.recipes.base import Batch, Recipe, close_loader


def micro_batches(recipe: Recipe, rank: int, world_size: int, count: int, state: Any = None) -> list[Batch]:
    """The next ``count`` micro-batches of a fresh loader (resumed from ``state`` when given)."""
    loader = recipe.train_loader(rank, world_size)
    try:
        if state is not None:
            loader.load_state_dict(state)
        return [loader.next_microbatch() for _ in range(count)]
    finally:
        close_loader(loader)


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
        close_loader(loader)
    problem = same_batches(micro_batches(recipe, 0, 1, accum, state), expected)
    if problem:
        raise AssertionError(f"a loader resumed from its state after step 1 differs: {problem}")
    return "step 2 equal after a restore at step 1"


def check_world_sizes(recipe: Recipe, job: JobConfig) -> str:
    """The 2 ranks' first micro-batches share no sample; then, where the recipe's data order does
    not depend on the world size, step 1's global batch, concatenated over ranks, is the same at
    1 and 2 ranks (else there is nothing to compare it with)."""
    disjoint = check_ranks_disjoint(recipe, job)
    if not recipe.world_size_invariant_order:
        order = "the global batch not compared (world_size_invariant_order = False)"
        if disjoint is None:  # nothing was compared: no PASS
            raise Skip(f"{RANKS_NOT_COMPARED}; {order}")
        return f"{disjoint}; {order}"
    one = _global_batch(recipe, job, 1)
    two = _global_batch(recipe, job, 2)
    problem = same_batches([one], [two])
    if problem:
        raise AssertionError(f"the global batch at 2 ranks differs from 1 rank's: {problem}")
    return f"{disjoint or RANKS_NOT_COMPARED}; {len(one[0])} samples of step 1 equal"


RANKS_NOT_COMPARED = "ranks not compared (step 1 at 1 rank repeats a sample: the data cannot tell them apart)"


def check_ranks_disjoint(recipe: Recipe, job: JobConfig) -> str | None:
    """No sample of rank 1's first micro-batch at world size 2 is in rank 0's: a loader that
    ignores its rank trains every rank on the same samples, and with the order declared
    world-size dependent no other property compared what the ranks see. Samples are told apart
    by their tensors, so not where step 1 at 1 rank already repeats one (the check's data is
    smaller than a step, or holds the same sample twice): None there."""
    step = [
        key for b in micro_batches(recipe, 0, 1, grad_accum_steps(job.train, 1)) for key in _sample_keys(b)
    ]
    if len(set(step)) < len(step):
        return None
    first, second = (_sample_keys(micro_batches(recipe, rank, 2, 1)[0]) for rank in (0, 1))
    seen = set(first)
    shared = sum(key in seen for key in second)
    if shared:
        raise AssertionError(
            f"{shared} of the {len(second)} samples of rank 1's first micro-batch are in rank 0's (world "
            "size 2): train_loader(rank, world_size) must shard by rank, each rank its own samples"
        )
    return f"the 2 ranks' first micro-batches disjoint ({len(second)} samples each)"


def _sample_keys(batch: Batch) -> list[tuple[bytes, ...]]:
    """A micro-batch's samples, each as the bytes of row i of every tensor whose first dimension
    is the batch's (with its shape and dtype: equal bytes of other tensors are no match)."""
    size = batch[0].shape[0] if batch and batch[0].dim() else 0
    rows = [t for t in batch if t.dim() and t.shape[0] == size]
    return [tuple(_row_bytes(t[i]) for t in rows) for i in range(size)]


def _row_bytes(row: torch.Tensor) -> bytes:
    flat = row.detach().cpu().reshape(-1).contiguous()
    return f"{tuple(row.shape)}{flat.dtype}".encode() + flat.view(torch.uint8).numpy().tobytes()


def _global_batch(recipe: Recipe, job: JobConfig, world_size: int) -> Batch:
    """Every rank's micro-batches of step 1, concatenated in rank order: (global batch, ...)."""
    accum = grad_accum_steps(job.train, world_size)
    parts = [b for rank in range(world_size) for b in micro_batches(recipe, rank, world_size, accum)]
    return tuple(torch.cat([p[i] for p in parts]) for i in range(len(parts[0])))
