"""Collectives as this torch spells them, and the functional collectives' aten ops."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hpcpipe.compat.guard import probe


def gather_into_tensor_fn() -> Callable[..., Any]:
    """all_gather into one tensor: ``all_gather_single`` where torch has it (2.14+)."""
    import torch.distributed as dist

    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def reduce_scatter_tensor_fn() -> Callable[..., Any]:
    """reduce_scatter from one tensor: ``reduce_scatter_single`` where torch has it (2.14+)."""
    import torch.distributed as dist

    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def functional_collective_ops() -> list[Any]:
    """The aten-level ops of the functional collectives (``torch.ops._c10d_functional``) that
    tensor parallelism issues inside a block: all-gather, reduce-scatter, all-reduce; the ones this
    torch has (selective activation checkpointing keeps their outputs)."""
    namespace = torch.ops._c10d_functional
    names = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce")
    return [getattr(namespace, name).default for name in names if hasattr(namespace, name)]


PRIVATE_APIS: dict[str, Callable[[], Any]] = {
    "ops._c10d_functional (all_gather_into_tensor, reduce_scatter_tensor, all_reduce)": probe(
        torch.ops, "_c10d_functional", "all_reduce", purpose="keep collectives in selective checkpointing"
    ),
}
"""The private names this module reaches, each with a probe (``hpcpipe.compat.PRIVATE_APIS``)."""
