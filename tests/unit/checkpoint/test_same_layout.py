"""The same-layout restore (no DCP planner): taken when the destination has the checkpoint's
layout, not taken otherwise, bitwise what DCP's path loads, and a changed byte still fails the
restore and falls back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tests.unit.checkpoint.test_store import (
    _flip_bit,
    assert_same,
    make_model,
    restore_into_fresh,
    save_steps,
    snapshot,
    store_for,
)

from hpcpipe.checkpoint import dcp_load, same_layout
from hpcpipe.checkpoint.safe_dcp import safe_load_metadata


@pytest.fixture
def paths(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Which path each restore attempt took: "same_layout" or "dcp"."""
    taken: list[str] = []
    real_load, real_dcp = same_layout.load, dcp_load._load_through_dcp

    def spy_load(*args: Any, **kwargs: Any) -> None:
        taken.append("same_layout")
        real_load(*args, **kwargs)

    def spy_dcp(*args: Any, **kwargs: Any) -> None:
        taken.append("dcp")
        real_dcp(*args, **kwargs)

    monkeypatch.setattr(same_layout, "load", spy_load)
    monkeypatch.setattr(dcp_load, "_load_through_dcp", spy_dcp)
    return taken


def _full(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return {"groups": [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]}


def test_same_layout_is_taken_and_loads_what_was_saved(tmp_path: Path, paths: list[str]) -> None:
    states = save_steps(tmp_path, [1, 2])
    extra, restored, _ = restore_into_fresh(tmp_path)
    assert paths == ["same_layout"]
    assert extra == {"step": 2}
    assert_same(restored, states[2])


def test_bitwise_equal_to_dcps_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, paths: list[str]
) -> None:
    save_steps(tmp_path, [1])
    results = []
    for force_dcp in (False, True):
        if force_dcp:
            monkeypatch.setattr(same_layout, "plan", lambda metadata, state: None)
        model, optimizer = make_model(seed=7)
        for group in optimizer.param_groups:  # non-tensor values come from the checkpoint too
            group["lr"], group["betas"] = 0.5, (0.1, 0.2)
        store = store_for(tmp_path)
        assert store.restore(model, optimizer) == {"step": 1}
        store.close()
        results.append((snapshot(model, optimizer), _full(optimizer)))
    assert paths == ["same_layout", "dcp"]
    (fast, fast_groups), (dcp, dcp_groups) = results
    assert_same(fast, dcp)
    assert fast_groups == dcp_groups and fast_groups["groups"][0]["lr"] == 1e-2
    for key, value in fast["params"].items():  # bitwise
        assert torch.equal(value.view(torch.uint8), dcp["params"][key].view(torch.uint8)), key


def test_another_dtype_takes_dcps_path_and_casts(tmp_path: Path, paths: list[str]) -> None:
    states = save_steps(tmp_path, [1])
    model, optimizer = make_model(seed=3)
    model = model.double()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    store = store_for(tmp_path)
    assert store.restore(model, optimizer) == {"step": 1}
    store.close()
    assert paths == ["dcp"]
    for key, value in model.state_dict().items():
        assert torch.equal(value, states[1]["params"][key].double()), key


def test_flipped_byte_fails_the_same_layout_read_and_falls_back(tmp_path: Path, paths: list[str]) -> None:
    states = save_steps(tmp_path, [1, 2])
    bad = _flip_bit(tmp_path / "step-00000002")
    events: list[tuple[str, dict[str, Any]]] = []
    extra, restored, _ = restore_into_fresh(tmp_path, events)
    assert paths == ["same_layout", "same_layout"]  # step 2 fails verification, step 1 loads
    assert extra == {"step": 1}
    assert_same(restored, states[1])
    fallback = next(fields for kind, fields in events if kind == "checkpoint_fallback")
    assert fallback["file"] == bad and fallback["step"] == 2 and "mismatch" in fallback["reason"]


def _metadata(ckpt: Path) -> Any:
    with (ckpt / ".metadata").open("rb") as handle:
        return safe_load_metadata(handle, str(ckpt))


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


def test_plan_refuses_any_difference_in_layout(tmp_path: Path) -> None:
    save_steps(tmp_path, [1])
    metadata = _metadata(tmp_path / "step-00000001")
    model, optimizer = make_model()
    state = _state(model, optimizer)
    found = same_layout.plan(metadata, state)
    assert found is not None and found.items == len(same_layout.flatten(state) or {})

    name = next(iter(state["model"]))
    for changed in (state["model"][name][:1], state["model"][name].double()):  # shape, dtype
        other = {**state, "model": {**state["model"], name: changed}}
        assert same_layout.plan(metadata, other) is None
    extra_key = {**state, "model": {**state["model"], "not.saved": torch.zeros(1)}}
    assert same_layout.plan(metadata, extra_key) is None
    missing_key = {**state, "model": {k: v for k, v in state["model"].items() if k != name}}
    assert same_layout.plan(metadata, missing_key) is not None  # DCP loads only what is asked, too


def test_flatten_matches_dcps_keys_and_paths(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    model, optimizer = make_model()
    state = _state(model, optimizer)
    planner = DefaultLoadPlanner()
    planner.set_up_planner(state, None, True)
    flat = same_layout.flatten(state)
    assert flat is not None
    assert {key: path for key, (path, _) in flat.items()} == planner.mappings


def test_tied_weights_are_filled_once_while_reading_and_a_flip_in_either_is_caught(
    tmp_path: Path, paths: list[str]
) -> None:
    states = save_steps(tmp_path, [1, 2])
    ckpt = tmp_path / "step-00000002"
    metadata = _metadata(ckpt)
    model, optimizer = make_model()
    found = same_layout.plan(metadata, _state(model, optimizer))
    assert found is not None
    items = {item.fqn: item for file in found.files.values() for item in file}
    tied = [items["model.tok_emb.weight"], items["model.lm_head.weight"]]
    assert sorted(item.after is None for item in tied) == [False, True]  # one in place, one after
    later = next(item for item in tied if item.after is not None)
    info = next(i for index, i in metadata.storage_data.items() if index.fqn == later.fqn)
    data = bytearray((ckpt / info.relative_path).read_bytes())
    data[info.offset + info.length // 2] ^= 0x10  # inside the copy read into a buffer
    (ckpt / info.relative_path).write_bytes(bytes(data))
    extra, restored, _ = restore_into_fresh(tmp_path)
    assert paths == ["same_layout", "same_layout"] and extra == {"step": 1}
    assert_same(restored, states[1])


def test_a_destination_that_is_not_contiguous_is_filled_after_its_file_verified(tmp_path: Path) -> None:
    from hpcpipe.checkpoint.manifest import read_manifest
    from hpcpipe.checkpoint.safe_dcp import SafeFileSystemReader

    states = save_steps(tmp_path, [1])
    ckpt = tmp_path / "step-00000001"
    model, optimizer = make_model(seed=9)
    state = _state(model, optimizer)
    name = next(k for k, v in state["model"].items() if v.dim() == 2)
    rows, cols = state["model"][name].shape
    state["model"][name] = torch.zeros(cols, rows).t()  # same shape and dtype, not contiguous
    reader = SafeFileSystemReader(ckpt, read_manifest(ckpt))
    found = same_layout.plan(reader.read_metadata(), state)
    assert found is not None
    item = next(i for file in found.files.values() for i in file if i.fqn == f"model.{name}")
    assert item.after is not None and item.span.target is None
    same_layout.load(reader, found, state, threads=2)
    assert torch.equal(state["model"][name], states[1]["params"][name])
