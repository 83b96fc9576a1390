"""Dropout on a sequence-parallel shard: draw the whole tensor's mask, keep this rank's part.

Under sequence parallelism (``models/gpt_parallel.py``) the residual dropout runs on each rank's
chunk of the sequence, (B, T/tp, C). The tp ranks share one random stream (their replicated
activations must stay equal: ``train/mesh.py``'s ``dropout_seed``), so a plain ``nn.Dropout``
drew the same mask on every rank: token t and token t + T/tp were dropped together.

``ShardOfWholeDropout`` draws the mask of the whole (B, T, C) tensor from that shared stream, as
one process would, and keeps its own chunk. The masks are then the one-process run's (bit for bit
on CPU, whose dropout draws one Bernoulli per element in this order; CUDA's fused dropout draws in
another, so there they are a different sample of the same distribution), the stream stays in step
on every rank, and activation checkpointing's recomputation, which replays torch's stream, draws
the same mask again. The cost: tp times a shard's random numbers and a transient (B, T, C)
tensor, the size of the all-gathered input the next attention or MLP takes anyway. Megatron-LM
instead gives each rank its own stream in such regions, which needs that state saved, restored and
replayed beside torch's.

A tensor-parallel plan names such a module with ``ShardDropout(dim)``; ``train/tensor_parallel.py``
swaps it in (DTensor's parallel styles have no dropout of their own).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hpcpipe.errors import ConfigError


@dataclass(frozen=True)
class ShardDropout:
    """A plan entry: the named ``nn.Dropout`` sees this rank's equal chunk of dimension ``dim``."""

    dim: int


class ShardOfWholeDropout(nn.Module):
    """``nn.Dropout(p)`` of the whole tensor, applied to chunk ``rank`` of ``size`` along ``dim``."""

    def __init__(self, p: float, dim: int, rank: int, size: int) -> None:
        super().__init__()
        self.p, self.dim, self.rank, self.size = p, dim, rank, size

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: this rank's chunk, e.g. (B, T/tp, C)
        if not self.training or self.p == 0.0:
            return x
        if self.p == 1.0:  # as torch's dropout: zeros, no random numbers drawn
            return x * 0.0
        whole = list(x.shape)
        whole[self.dim] *= self.size  # e.g. (B, T, C)
        keep = torch.empty(whole, dtype=x.dtype, device=x.device).bernoulli_(1.0 - self.p)
        chunk = x.shape[self.dim]
        # contiguous: autograd keeps the chunk's mask for backward, not the whole one
        mine = keep.narrow(self.dim, self.rank * chunk, chunk).contiguous()
        return x * mine.div_(1.0 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}, dim={self.dim}, rank={self.rank} of {self.size}"


def swap_in_shard_dropout(model: nn.Module, name: str, entry: ShardDropout, rank: int, size: int) -> None:
    """Replace the ``nn.Dropout`` at ``name`` by its ``ShardOfWholeDropout`` on rank ``rank``."""
    current = model.get_submodule(name)
    if not isinstance(current, nn.Dropout):
        raise ConfigError(
            f"parallel.tp: the recipe's tensor-parallel plan gives {name} ShardDropout, but it is a "
            f"{type(current).__name__}, not an nn.Dropout"
        )
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent), attr, ShardOfWholeDropout(current.p, entry.dim, rank, size))
