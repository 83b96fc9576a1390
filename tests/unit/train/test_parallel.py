"""train/parallel.py on one process: which buffers evaluations and checkpoints share."""

from __future__ import annotations

import torch
from torch import nn

from hpcpipe.train.parallel import shared_buffers


def test_only_saved_floating_point_buffers_are_shared() -> None:
    """BatchNorm's running statistics are; its forward count and a RoPE-like table (not saved,
    the same on every rank by construction) are not sent at every evaluation and checkpoint."""
    norm = nn.BatchNorm1d(3)
    model = nn.Sequential(nn.Linear(2, 3), norm)
    model.register_buffer("rope", torch.ones(4), persistent=False)
    assert [id(b) for b in shared_buffers(model)] == [id(norm.running_mean), id(norm.running_var)]
    assert shared_buffers(nn.Linear(2, 3)) == []
