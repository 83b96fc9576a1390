"""The async save's staging copy: values equal to torch's ``_copy_state_dict``, buffers reused
from one save to the next, and torch's copy for what the byte copy does not handle."""

from __future__ import annotations

import io
from typing import Any

import torch

from hpcpipe import compat
from hpcpipe.checkpoint.staging import SLICE, Staging


def _state() -> dict[str, Any]:
    torch.manual_seed(0)
    return {
        "model": {
            "big": torch.randn(SLICE // 4 * 2 + 7),  # several slices, and a short last one
            "bf16": torch.randn(64, 33).to(torch.bfloat16),
            "step": torch.tensor(3.0),
            "empty": torch.zeros(0, 5),
            "flags": torch.tensor([True, False]),
        },
        "optim": {
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.95), "params": ["big"]}],
            "raw": io.BytesIO(),
        },
        "none": None,
    }


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    if isinstance(value, list | tuple):
        return [t for item in value for t in _tensors(item)]
    return []


def _same_structure(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b) and a.dtype == b.dtype
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _same_structure(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same_structure(x, y)
    else:
        assert a is b


def test_staged_copy_equals_torchs_and_reuses_its_buffers() -> None:
    state = _state()
    staging = Staging(threads=2)
    try:
        first = staging.stage(state)
        expected = compat.copy_state_dict(state, compat.create_cpu_state_dict(state, pin_memory=False))
        _same_structure(first, expected)
        for source, copy in zip(_tensors(state), _tensors(first), strict=True):
            assert copy.data_ptr() != source.data_ptr() or source.numel() == 0
        with torch.no_grad():
            for tensor in _tensors(state):
                tensor.add_(1) if tensor.dtype != torch.bool else tensor.logical_not_()
        second = staging.stage(state)
        _same_structure(second, compat.copy_state_dict(state, compat.create_cpu_state_dict(state, False)))
        assert [t.data_ptr() for t in _tensors(second)] == [t.data_ptr() for t in _tensors(first)]
    finally:
        staging.close()


def test_a_snapshot_stays_as_it_was_when_the_state_changes() -> None:
    state = _state()
    staging = Staging(threads=1)
    staged = staging.stage(state)
    before = staged["model"]["big"].clone()
    state["model"]["big"].mul_(2)
    assert torch.equal(staged["model"]["big"], before)


def test_unusual_tensors_take_torchs_copy() -> None:
    state = {"t": torch.randn(8, 4).t(), "x": torch.randn(3)}  # not contiguous
    staging = Staging()
    try:
        staged = staging.stage(state)
        assert torch.equal(staged["t"], state["t"]) and torch.equal(staged["x"], state["x"])
        state["x"].add_(1)
        assert torch.equal(staging.stage(state)["x"], state["x"])
    finally:
        staging.close()


def test_a_new_layout_gets_new_buffers() -> None:
    staging = Staging()
    try:
        first = staging.stage({"w": torch.ones(4)})
        second = staging.stage({"w": torch.ones(5)})
        assert second["w"].shape == (5,) and first["w"].shape == (4,)
    finally:
        staging.close()
