"""checkpoint/dcp_load.py: loading a checkpoint into a model and its optimizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tests.unit.checkpoint.test_store import assert_same, snapshot

from hpcpipe.checkpoint import CheckpointStore
from hpcpipe.config import CheckpointConfig


class _SpareHead(torch.nn.Module):
    """A head the loss never uses (as an expert no token reaches): the optimizer has no state for it."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.spare = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


@pytest.mark.parametrize("layout", [None, {"pp": 2}])  # pp > 1: the optimizer state is saved flat
def test_a_parameter_without_optimizer_state_resumes_exactly(tmp_path: Path, layout: Any) -> None:
    """A strict load refused the checkpoint; made lenient, the flat form crashed in Adam's
    __setstate__, and the parameter got the fresh optimizer's state (a step taken)."""

    def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    torch.manual_seed(0)
    model = _SpareHead()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step(model, optimizer)
    store = CheckpointStore(CheckpointConfig(), tmp_path, config_hash="cafe", layout=layout)
    store.save(1, model, optimizer, {"step": 1})
    store.close()
    torch.manual_seed(1)
    fresh = _SpareHead()
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    store = CheckpointStore(CheckpointConfig(), tmp_path, config_hash="cafe", layout=layout)
    assert store.restore(fresh, fresh_optimizer) is not None
    store.close()
    assert fresh.spare.weight not in fresh_optimizer.state and fresh.body.weight in fresh_optimizer.state
    step(model, optimizer)
    step(fresh, fresh_optimizer)
    assert_same(snapshot(model, optimizer), snapshot(fresh, fresh_optimizer))  # type: ignore[arg-type]
