"""Dropout on sequence-parallel shards: each rank's mask is its chunk of the one-process mask."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hpcpipe.errors import ConfigError
from hpcpipe.models.shard_dropout import ShardDropout, ShardOfWholeDropout, swap_in_shard_dropout

P = 0.25


@pytest.mark.parametrize("size", [2, 4])
def test_each_chunk_is_the_one_process_dropout_of_its_part(size: int) -> None:
    whole = torch.randn(3, 8, 5)  # (B, T, C)
    torch.manual_seed(11)
    expected = nn.Dropout(P)(whole)
    stream_after = torch.get_rng_state()
    chunk = whole.shape[1] // size
    for rank in range(size):
        torch.manual_seed(11)  # every tp rank starts from the same stream
        mine = whole[:, rank * chunk : (rank + 1) * chunk]
        got = ShardOfWholeDropout(P, dim=1, rank=rank, size=size)(mine)
        assert torch.equal(got, expected[:, rank * chunk : (rank + 1) * chunk])
        assert torch.equal(torch.get_rng_state(), stream_after)  # the ranks' streams stay in step


def test_the_chunks_masks_differ() -> None:
    """The defect this fixes: plain dropout on two ranks sharing a stream drops the same places."""
    ones = torch.ones(2, 16, 4)
    masks = []
    for rank in range(2):
        torch.manual_seed(3)
        masks.append(ShardOfWholeDropout(0.5, dim=1, rank=rank, size=2)(ones[:, :8]) == 0)
    assert not torch.equal(masks[0], masks[1])


def test_backward_scales_by_the_kept_mask_and_eval_is_identity() -> None:
    x = torch.randn(2, 4, 3, requires_grad=True)
    module = ShardOfWholeDropout(P, dim=1, rank=1, size=2)
    torch.manual_seed(5)
    out = module(x)
    out.sum().backward()
    assert x.grad is not None
    kept = out.detach() != 0
    assert torch.equal(x.grad, kept.float() / (1 - P))
    assert module.eval()(x) is x
    assert torch.equal(ShardOfWholeDropout(1.0, 1, 0, 2)(x.detach()), torch.zeros_like(x))


def test_swap_needs_a_dropout_where_the_plan_says() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1))
    swap_in_shard_dropout(model, "1", ShardDropout(dim=1), rank=1, size=2)
    assert isinstance(model[1], ShardOfWholeDropout) and model[1].p == 0.1 and model[1].rank == 1
    with pytest.raises(ConfigError, match="gives 0 ShardDropout, but it is a Linear"):
        swap_in_shard_dropout(model, "0", ShardDropout(dim=1), rank=0, size=2)
